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


def _peers_missing() -> str | None:
    import importlib.util

    from agenttx_bench.peers import Skipped, _pg_bin

    try:
        _pg_bin("initdb")
    except Skipped as exc:
        return str(exc)
    for module in ("langgraph", "langgraph.checkpoint.postgres", "dbos", "psycopg"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install 'agenttx[bench]')"
    return None


def test_bench_peers_run_the_same_workflow_beside_agenttx_as_ratios_to_the_same_cas():
    import pytest

    missing = _peers_missing()
    if missing:
        pytest.skip(f"peers cannot run here: {missing}")
    out = subprocess.run(
        [sys.executable, "-m", "agenttx", "bench", "--baseline", "--baseline-n", "50",
         "--workflows", "3", "--transactions", "0", "--peers", "--peer-workflows", "4",
         "--json"],
        capture_output=True, text=True, timeout=240, check=True)
    r = json.loads(out.stdout)
    assert set(r["peers"]) == {"langgraph_postgres", "dbos"}
    assert r["peers"]["langgraph_postgres"]["durability"] == "sync"
    for name in ("langgraph_postgres", "dbos"):
        assert r["peers"][name]["workflows"] == 4
        assert r["peers"][name]["step_ms"]["n"] == 4 * 9  # 9 gaps between 10 steps
    systems = r["ratios"]["systems"]
    assert list(systems) == ["agenttx", "langgraph_postgres", "dbos"]
    cas = r["ratios"]["cas_p50_ms"]
    for row in systems.values():
        assert row["step_p50_over_cas"] == round(row["step_p50_ms"] / cas, 2)
        assert row["workflows_per_s"] > 0
    assert systems["dbos"]["agenttx_workflows_per_s_over_this"] == round(
        systems["agenttx"]["workflows_per_s"] / systems["dbos"]["workflows_per_s"], 2)
    assert "peers: langgraph_postgres" in out.stderr


def test_bench_compares_two_workers_with_one_in_the_same_run():
    out = subprocess.run(
        [sys.executable, "-m", "agenttx", "bench", "--workflows", "2", "--transactions", "8",
         "--concurrency", "4", "--tx-steps", "3", "--compare-workers", "2", "--json"],
        capture_output=True, text=True, timeout=240, check=True)
    r = json.loads(out.stdout)
    wk = r["workers"]
    assert wk["workers"] == 2 and wk["concurrent"]["errors"] == 0
    assert wk["concurrent"]["transactions"] == 8 and wk["concurrent"]["agents"] == 4
    assert wk["steps_per_s_1_worker"] == r["concurrent"]["steps_per_s"]
    assert wk["ratio"] == round(wk["concurrent"]["steps_per_s"] / r["concurrent"]["steps_per_s"], 2)
