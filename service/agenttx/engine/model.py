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
    approver: bool = False          # role `approver` (docs/approvals.md)


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
    # the commit stopped at the approval gate (docs/approvals.md): nothing committed
    awaiting_approval: bool = False
    approval_digest: str = ""


@dataclass
class GatedStepView:
    """One step of a pending approval: a gated call (tool, resolved arguments) or an
    effect on a gated channel (tool `effect.stage`, channel, payload)."""

    step_id: int
    tool: str
    channel: str
    arguments_json: str


@dataclass
class ApprovalView:
    """A pending approval as ListApprovals shows it."""

    transaction_id: str
    principal: str
    agent_id: str
    digest: str
    gated: list[GatedStepView]
    write_keys: list[str]
    requested_at: float
    expires_at: float


@dataclass
class ApprovalPage:
    approvals: list[ApprovalView]
    next_page_token: str


@dataclass
class DecisionOutcome:
    """DecideApproval's answer: COMMITTED, REJECTED, or ABORTED (approved, but a key it
    read or wrote was committed by another transaction since: compensated)."""

    status: str
    steps_committed: int = 0
    effects_dispatched: int = 0
    dispatch_errors: list[str] = field(default_factory=list)


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
    status: str                      # ACTIVE | AWAITING_ROLLBACK | AWAITING_APPROVAL |
                                     # COMMITTED | ABORTED | EXPIRED | REJECTED
    agent_id: str
    principal: str
    created_at: float
    ended_at: float                  # 0 while open
    ended_by: str                    # principal ("" without auth), "reaper"; "" while open
    reason: str
    steps_committed: int
    effects: int
    steps: list[HistoryEntry]
