"""The outcomes report: figures follow from the run records, in the shape
docs/benchmarks.md#agent-outcomes pins."""

from __future__ import annotations

from agenttx_bench.outcomes.records import BenchRun, RunRecord
from agenttx_bench.outcomes.report import summarize, table


def rec(task: str, system: str, p: float, outcome: str, steps: int, *, dup: int = 0,
        leaked: int = 0, resent: int = 0) -> RunRecord:
    return RunRecord(task, system, p, outcome, "f" * 64, "e" * 64, steps, 0.5, dup, leaked,
                     ["transient"] if p else [], "done", resent)


def sample() -> BenchRun:
    run = BenchRun(seed=5, tasks=2, ps=[0.3], scheduled={"0.3": {"transient": 2}})
    for system in ("agenttx", "naive_retry", "restart"):
        run.fault_free += [rec("a", system, 0.0, "correct", 10), rec("b", system, 0.0, "correct", 20)]
    run.runs += [rec("a", "agenttx", 0.3, "correct", 11), rec("b", "agenttx", 0.3, "correct", 25, resent=3),
                 rec("a", "naive_retry", 0.3, "corrupt", 12, leaked=1),
                 rec("b", "naive_retry", 0.3, "correct", 21),
                 rec("a", "restart", 0.3, "partial", 30), rec("b", "restart", 0.3, "corrupt", 60, dup=2)]
    return run


def test_results_follow_from_the_records_with_an_aggregate_steps_ratio():
    report = summarize(sample(), "out.png")
    assert set(report) >= {"seed", "tasks", "p", "results", "runs", "plot"}
    assert (report["seed"], report["tasks"], report["p"], report["plot"]) == (5, 2, [0.3], "out.png")
    by = {r["system"]: r for r in report["results"]}
    assert by["agenttx"] == {
        "system": "agenttx", "p": 0.3, "tasks": 2, "success": 2, "success_rate": 1.0,
        "partial": 0, "corrupt": 0, "duplicate_effects": 0, "leaked_effects": 0,
        "steps": 36, "resent": 3, "fault_free_steps": 30, "steps_ratio": 1.2,
        "steps_ratio_with_resent": 1.3, "wall_s": 1.0,
        "faults_fired": {"transient": 2}}
    assert (by["naive_retry"]["success_rate"], by["naive_retry"]["leaked_effects"]) == (0.5, 1)
    assert (by["restart"]["partial"], by["restart"]["corrupt"], by["restart"]["steps_ratio"]) \
        == (1, 1, 3.0)
    assert by["restart"]["duplicate_effects"] == 2
    run = report["runs"][0]
    assert {k: run[k] for k in ("task", "system", "p", "outcome")} == \
        {"task": "a", "system": "agenttx", "p": 0.3, "outcome": "correct"}
    assert len(run["final_state_sha256"]) == len(run["expected_state_sha256"]) == 64


def test_targets_are_checked_for_agenttx_at_p_03():
    report = summarize(sample(), None)
    assert report["targets"]["met"] is True
    run = sample()
    run.runs[1] = rec("b", "agenttx", 0.3, "correct", 40)  # 51/30 = 1.7x the steps
    targets = summarize(run, None)["targets"]
    assert targets["met"] is False and targets["checks"]["steps_ratio"] is False


def test_the_table_names_every_system_and_the_targets():
    text = table(summarize(sample(), None))
    lines = text.splitlines()
    assert lines[3].split()[:5] == ["agenttx", "0.3", "2", "2", "100.0%"]
    assert lines[-1] == "targets (agenttx at p=0.3): all met"
    assert "fault-free: agenttx 2/2 correct in 30 steps" in text
    assert lines[2].split()[11:14] == ["steps", "re-sent", "fault-free"]
    assert lines[3].split()[9:12] == ["36", "3", "30"]
