"""`agenttx bench outcomes --tasks 5 --p 0.3` end to end: its own etcd, two real replicas,
real webhook deliveries, the report of docs/benchmarks.md#agent-outcomes on stdout and a PNG figure."""

from __future__ import annotations

import json
import subprocess
import sys

from agenttx_bench.outcomes import tasks
from agenttx_bench.outcomes.faults import FaultSchedule

RESULT_KEYS = {"system", "p", "tasks", "success", "success_rate", "partial", "corrupt",
               "duplicate_effects", "leaked_effects", "steps", "resent", "fault_free_steps",
               "steps_ratio", "steps_ratio_with_resent", "wall_s"}
RUN_KEYS = {"task", "system", "p", "outcome", "final_state_sha256", "expected_state_sha256"}


def test_small_run_agenttx_ends_every_task_correct_with_baselines_beside_it(tmp_path):
    png = tmp_path / "outcomes.png"
    out = subprocess.run(
        [sys.executable, "-m", "agenttx", "bench", "outcomes", "--tasks", "5", "--p", "0.3",
         "--seed", "1", "--json", "--plot", str(png)],
        capture_output=True, text=True, timeout=240, check=True)
    report = json.loads(out.stdout)
    assert (report["seed"], report["tasks"], report["p"], report["plot"]) == (1, 5, [0.3], str(png))
    by = {r["system"]: r for r in report["results"]}
    assert set(by) == {"agenttx", "naive_retry", "restart"}
    fault_free = sum(len(t.ops) for t in tasks.suite(5))
    for row in report["results"]:
        assert set(row) >= RESULT_KEYS
        assert (row["p"], row["tasks"], row["fault_free_steps"]) == (0.3, 5, fault_free)
        assert row["success"] + row["partial"] + row["corrupt"] == 5
        assert row["steps_ratio"] == round(row["steps"] / fault_free, 3)
        assert row["steps_ratio_with_resent"] == \
            round((row["steps"] + row["resent"]) / fault_free, 3)
    assert by["naive_retry"]["resent"] == by["restart"]["resent"] == 0  # no client, no re-send
    agenttx = by["agenttx"]
    assert (agenttx["success"], agenttx["corrupt"], agenttx["duplicate_effects"],
            agenttx["leaked_effects"]) == (5, 0, 0, 0)
    assert agenttx["steps"] > fault_free  # the faults cost steps: none was skipped
    # the schedule is the seed's: the CLI injected exactly what FaultSchedule(1, 0.3) says
    assert report["faults_scheduled"] == {"0.3": FaultSchedule(1, 0.3, tasks.suite(5)).counts()}
    assert sorted(k for r in report["runs"] if r["system"] == "agenttx" for k in r["faults"]) \
        == sorted(f.kind.value for f in FaultSchedule(1, 0.3, tasks.suite(5)).all())
    assert len(report["runs"]) == 15
    for run in report["runs"]:
        assert set(run) >= RUN_KEYS
        assert run["outcome"] in ("correct", "partial", "corrupt")
        assert (run["outcome"] == "correct") == \
            (run["final_state_sha256"] == run["expected_state_sha256"])
    assert all(r["success"] == 5 for r in report["fault_free"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "outcomes: p=0.3 task 5/5" in out.stderr  # progress on stderr


def test_bad_flags_exit_2_with_a_message():
    out = subprocess.run([sys.executable, "-m", "agenttx", "bench", "outcomes", "--p", "1.5"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "a fault rate is within (0, 1], got 1.5" in out.stderr
