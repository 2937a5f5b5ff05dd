"""`agenttx bench` runs end to end against its own embedded etcd and reports every figure
as a ratio to baselines measured in the same run (a raw etcd CAS, an empty gRPC call)."""

import json
import subprocess
import sys


def test_bench_reports_ratios_to_same_run_baselines():
    out = subprocess.run(
        [sys.executable, "-m", "agenttx", "bench", "--baseline", "--baseline-n", "50",
         "--workflows", "3", "--transactions", "4", "--concurrency", "2", "--tx-steps", "3",
         "--steps", "12", "--rss-transactions", "20", "--json"],
        capture_output=True, text=True, timeout=180, check=True)
    r = json.loads(out.stdout)
    base = r["baseline"]
    assert base["cas"]["latency_ms"]["n"] == 50 and base["cas"]["per_s"] > 0
    assert base["empty_grpc"]["latency_ms"]["n"] == 50
    wf = r["workflows"]
    assert (wf["workflows"], wf["steps_per_workflow"]) == (3, 10)
    assert wf["latency_ms"]["ExecuteStep kv.put"]["n"] == 30
    assert set(wf["latency_ms"]) == {"BeginTransaction", "ExecuteStep kv.put", "CommitTransaction"}
    assert r["replica_cpu_ms_per_step"] > 0
    ratios = r["ratios"]
    assert ratios["floor_p50_ms"] > ratios["cas_p50_ms"] > 0
    step = ratios["per_rpc"]["ExecuteStep kv.put"]
    assert step["p50_over_floor"] > 0 and step["p50_over_cas"] > step["p50_over_floor"]
    assert r["concurrent"]["errors"] == 0 and r["concurrent"]["transactions"] == 4
    assert 0 < ratios["steps_per_s_over_cas_per_s"]
    assert list(r["long"]["p50_by_step_ms"]) == ["1-10", "11-12"]
    assert r["long"]["commit_long_over_10"] > 0
    assert len(r["rss"]["rss_mib_samples"]) == 20
    assert "bench: " in out.stderr  # progress lines
