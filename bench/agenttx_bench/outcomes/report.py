"""Aggregate the runs into the pinned JSON report (docs/benchmarks.md) and a text table.

Why apart from the runner: the figures must follow from the per-run records alone (each
record carries its verdict and the hashes it was judged by), so anyone can recompute a
table from `runs` in the JSON. `steps_ratio` is aggregate steps over aggregate
fault-free steps of the same system on the same tasks, not a mean of ratios. A step is
a tool call the agent made; the calls the AgentTx client re-sent by itself after a lost
answer are counted apart (`resent`), and `steps_ratio_with_resent` counts them as steps
too, so the figure holds either way it is read.

Pure: no I/O (the plot, which writes a file, is in `plot`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from .records import SYSTEMS, BenchRun, RunRecord

# The bar for AgentTx at p = 0.3.
TARGETS = {"p": 0.3, "success_rate_min": 0.95, "corrupt_max": 0, "duplicate_effects_max": 0,
           "leaked_effects_max": 0, "steps_ratio_max": 1.5}


def _aggregate(system: str, p: float, recs: Sequence[RunRecord],
               fault_free: dict[tuple[str, str], int]) -> dict[str, Any]:
    n = len(recs)
    success = sum(r.outcome == "correct" for r in recs)
    steps = sum(r.steps for r in recs)
    resent = sum(r.resent for r in recs)
    ff = sum(fault_free.get((system, r.task), 0) for r in recs)
    fired = Counter(k for r in recs for k in r.faults)
    return {
        "system": system, "p": p, "tasks": n, "success": success,
        "success_rate": round(success / n, 4) if n else 0.0,
        "partial": sum(r.outcome == "partial" for r in recs),
        "corrupt": sum(r.outcome == "corrupt" for r in recs),
        "duplicate_effects": sum(r.duplicate_effects for r in recs),
        "leaked_effects": sum(r.leaked_effects for r in recs),
        "steps": steps, "resent": resent, "fault_free_steps": ff,
        "steps_ratio": round(steps / ff, 3) if ff else 0.0,
        "steps_ratio_with_resent": round((steps + resent) / ff, 3) if ff else 0.0,
        "wall_s": round(sum(r.wall_s for r in recs), 2),
        "faults_fired": dict(sorted(fired.items())),
    }


def targets_check(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """AgentTx's figures at p = 0.3 against the issue's targets (met: None if not run)."""
    row = next((r for r in results if r["system"] == "agenttx" and r["p"] == TARGETS["p"]), None)
    if row is None:
        return {**TARGETS, "met": None}
    checks = {
        "success_rate": row["success_rate"] >= TARGETS["success_rate_min"],
        "corrupt": row["corrupt"] <= TARGETS["corrupt_max"],
        "duplicate_effects": row["duplicate_effects"] <= TARGETS["duplicate_effects_max"],
        "leaked_effects": row["leaked_effects"] <= TARGETS["leaked_effects_max"],
        "steps_ratio": row["steps_ratio"] <= TARGETS["steps_ratio_max"],
    }
    return {**TARGETS, "checks": checks, "met": all(checks.values())}


def summarize(run: BenchRun, plot: str | None) -> dict[str, Any]:
    fault_free = {(r.system, r.task): r.steps for r in run.fault_free}
    systems = [s for s in SYSTEMS if any(r.system == s for r in run.fault_free + run.runs)]
    results = [_aggregate(s, p, [r for r in run.runs if r.system == s and r.p == p], fault_free)
               for p in run.ps for s in systems]
    ff_rows = []
    for s in systems:
        recs = [r for r in run.fault_free if r.system == s]
        ff_rows.append({"system": s, "tasks": len(recs),
                        "success": sum(r.outcome == "correct" for r in recs),
                        "steps": sum(r.steps for r in recs),
                        "wall_s": round(sum(r.wall_s for r in recs), 2)})
    return {
        "seed": run.seed, "tasks": run.tasks, "p": list(run.ps),
        "results": results,
        "runs": [r.as_json() for r in run.runs],
        "plot": plot,
        "fault_free": ff_rows,
        "faults_scheduled": run.scheduled,
        "replica_kills": run.replica_kills,
        "targets": targets_check(results),
        "wall_s": run.wall_s,
    }


_COLUMNS = ("system", "p", "tasks", "success", "rate", "partial", "corrupt", "dup fx",
            "leaked fx", "steps", "re-sent", "fault-free", "ratio", "wall s")


def table(report: dict[str, Any]) -> str:
    rows = [[r["system"], f"{r['p']:g}", str(r["tasks"]), str(r["success"]),
             f"{100 * r['success_rate']:.1f}%", str(r["partial"]), str(r["corrupt"]),
             str(r["duplicate_effects"]), str(r["leaked_effects"]), str(r["steps"]),
             str(r["resent"]), str(r["fault_free_steps"]), f"{r['steps_ratio']:.2f}", f"{r['wall_s']:.1f}"]
            for r in report["results"]]
    widths = [max(len(c), *(len(row[i]) for row in rows)) if rows else len(c)
              for i, c in enumerate(_COLUMNS)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(_COLUMNS, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
              for row in rows]
    ff = ", ".join(f"{r['system']} {r['success']}/{r['tasks']} correct in {r['steps']} steps"
                   for r in report["fault_free"])
    head = (f"agent outcomes: {report['tasks']} tasks, seed {report['seed']}, "
            f"{report['replica_kills']} replica kills, {report['wall_s']:.0f} s in all\n"
            f"fault-free: {ff}")
    t = report["targets"]
    if t["met"] is None:
        tail = "targets (agenttx at p=0.3): not measured (no --p 0.3)"
    else:
        missed = [k for k, ok in t["checks"].items() if not ok]
        tail = "targets (agenttx at p=0.3): " + ("all met" if t["met"] else
                                                  "missed: " + ", ".join(missed))
    return "\n".join([head, *lines, tail])
