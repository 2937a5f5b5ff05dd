"""`agenttx bench` runs end to end against its own embedded etcd and reports figures."""

import json
import subprocess
import sys


def test_bench_reports_latency_throughput_and_memory():
    out = subprocess.run(
        [sys.executable, "-m", "agenttx", "bench", "--transactions", "6", "--concurrency", "2",
         "--steps", "3", "--json"], capture_output=True, text=True, timeout=120, check=True)
    report = json.loads(out.stdout)
    assert report["errors"] == 0 and report["transactions"] == 6
    assert set(report["latency_ms"]) == {
        "BeginTransaction", "CommitTransaction", "ExecuteStep kv.put",
        "ExecuteStep record.insert", "ExecuteStep fs.write"}
    assert report["latency_ms"]["ExecuteStep kv.put"]["n"] == 6
    assert report["service_peak_rss_mib"] > 0
    assert "transactions" in out.stderr  # progress lines
