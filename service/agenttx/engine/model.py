"""Plain data the engine keeps in etcd (as JSON) and hands to the API layer.

The transaction header is the compare-and-swap anchor: every state change rewrites it
guarded by its mod_revision, in the same etcd transaction as the step records it
touches. Step records hold what a live step did: its output (for references), its
raw_context (for the context log), its buffered writes, staged effects and fs undo image.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .planner import Strategy

ACTIVE = "ACTIVE"
AWAITING_ROLLBACK = "AWAITING_ROLLBACK"


def to_json(doc: Any) -> bytes:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def from_json(raw: bytes) -> Any:
    return json.loads(raw)


@dataclass
class StepOutcome:
    status: str                      # SUCCESS | ROLLBACK_TRIGGERED | FAILED
    next_step_id: int
    constraints: list[str]
    output_json: str = ""
    clean_hint: str = ""
    strategy: Strategy = Strategy.NONE
    rollback_to_step: int = 0
    context_reset: bool = False
    error_category: str = ""
    rollback_latency_ms: float = 0.0
    abort_reason: str = ""
    compensation_errors: list[str] = field(default_factory=list)


@dataclass
class CommitOutcome:
    committed: bool
    steps_committed: int
    effects_dispatched: int
    dispatch_errors: list[str]


@dataclass
class RollbackOutcome:
    rolled_back: bool
    next_step_id: int
    compensations_run: int
    compensation_errors: list[str]


@dataclass
class ContextItem:
    step_id: int
    tool_name: str
    raw_context: str


@dataclass
class TransactionView:
    transaction_id: str
    status: str
    next_step_id: int
    constraints: list[str]
    global_resets: int
    agent_id: str
    context: list[ContextItem]
