"""Plain data the engine takes from and hands to the API layer (no grpc types)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .history import HistoryEntry
from .planner import Strategy


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is calling (SPEC §9): the authenticated principal, or the anonymous one when
    authentication is off ("" for everyone: ownership then holds trivially)."""

    principal: str = ""
    namespace: str | None = None
    admin: bool = False
    authenticated: bool = False


ANONYMOUS = Caller()


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
    principal: str = ""
    created_at: float = 0.0
    updated_at: float = 0.0


@dataclass
class TransactionSummary:
    transaction_id: str
    status: str
    agent_id: str
    principal: str
    next_step_id: int
    created_at: float
    updated_at: float


@dataclass
class TransactionPage:
    transactions: list[TransactionSummary]
    next_page_token: str


@dataclass
class TransactionHistory:
    """GetTransactionHistory: an open transaction as it stands, or how it ended."""

    transaction_id: str
    status: str                      # ACTIVE | AWAITING_ROLLBACK | COMMITTED | ABORTED | EXPIRED
    agent_id: str
    principal: str
    created_at: float
    ended_at: float                  # 0 while open
    ended_by: str                    # principal ("" without auth), "reaper"; "" while open
    reason: str
    steps_committed: int
    effects: int
    steps: list[HistoryEntry]
