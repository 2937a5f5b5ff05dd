"""What one benchmark run produced: a record per (task, system, fault rate) run.

Kept apart so the report (pure) can be built and tested from records alone. Plain data,
no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SYSTEMS = ("agenttx", "naive_retry", "restart")


@dataclass
class RunRecord:
    task: str
    system: str
    p: float
    outcome: str
    final_state_sha256: str
    expected_state_sha256: str
    steps: int
    wall_s: float
    duplicate_effects: int
    leaked_effects: int
    faults: list[str]
    note: str
    # Steps the AgentTx client re-sent by itself after a lost answer (not agent steps;
    # always 0 for the baselines, which have no client).
    resent: int = 0

    def as_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in (
            "task", "system", "p", "outcome", "final_state_sha256", "expected_state_sha256",
            "steps", "resent", "wall_s", "duplicate_effects", "leaked_effects", "faults",
            "note")}


@dataclass
class BenchRun:
    seed: int
    tasks: int
    ps: list[float]
    fault_free: list[RunRecord] = field(default_factory=list)
    runs: list[RunRecord] = field(default_factory=list)
    scheduled: dict[str, dict[str, int]] = field(default_factory=dict)
    wall_s: float = 0.0
    replica_kills: int = 0
