"""What `agenttx.client` returns: plain, immutable Python values.

Why not the protobuf messages: users should not depend on generated code (field names
stay, but presence rules, enum prefixes and repeated-field types are wire details), and
a frozen dataclass prints, compares and type-checks. Enums are `StrEnum`s whose values
are the wire names without their prefix (`Strategy.LOCAL_BACKTRACK == "LOCAL_BACKTRACK"`).

Pure: no I/O and no protobuf import here (conversion lives in `_core`).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class Strategy(enum.StrEnum):
    """How the service recovered from a failed step (SPEC §5). NONE on success."""

    NONE = "NONE"
    LOCAL_BACKTRACK = "LOCAL_BACKTRACK"
    DEPENDENCY_JUMP = "DEPENDENCY_JUMP"
    GLOBAL_RESET = "GLOBAL_RESET"
    MANUAL = "MANUAL"
    ABORT = "ABORT"


class StepStatus(enum.StrEnum):
    UNSPECIFIED = "UNSPECIFIED"
    SUCCESS = "SUCCESS"
    ROLLBACK_TRIGGERED = "ROLLBACK_TRIGGERED"
    FAILED = "FAILED"


class TransactionStatus(enum.StrEnum):
    """Open: ACTIVE, AWAITING_ROLLBACK, AWAITING_APPROVAL. Ended: COMMITTED, ABORTED,
    EXPIRED, REJECTED (GetTransaction answers NOT_FOUND for those; the history has them)."""

    UNSPECIFIED = "UNSPECIFIED"
    ACTIVE = "ACTIVE"
    AWAITING_ROLLBACK = "AWAITING_ROLLBACK"
    COMMITTED = "COMMITTED"
    ABORTED = "ABORTED"
    EXPIRED = "EXPIRED"
    AWAITING_APPROVAL = "AWAITING_APPROVAL"
    REJECTED = "REJECTED"

    @property
    def ended(self) -> bool:
        return self in _ENDED


_ENDED = frozenset({TransactionStatus.COMMITTED, TransactionStatus.ABORTED,
                    TransactionStatus.EXPIRED, TransactionStatus.REJECTED})


@dataclass(frozen=True)
class Policy:
    """Per-transaction rollback policy overrides; unset fields keep the server's (or the
    matching AgentTxPolicy's) values. Ranges: depth and resets 0-16, factor 0.1-1000."""

    max_local_depth: int | None = None
    max_global_resets: int | None = None
    replay_budget_factor: float | None = None

    @classmethod
    def of(cls, value: Policy | Mapping[str, Any] | None) -> Policy | None:
        if value is None or isinstance(value, Policy):
            return value
        unknown = set(value) - {"max_local_depth", "max_global_resets", "replay_budget_factor"}
        if unknown:
            raise TypeError(f"unknown policy field(s): {', '.join(sorted(unknown))}")
        return cls(**dict(value))


@dataclass(frozen=True)
class StepResult:
    """The answer to `tx.step(...)`. A failed step is a result, not an exception.

    `ok` is True on success, with `output` the tool's parsed JSON output. Otherwise
    `category` (a PostgreSQL condition name) and `hint` say what went wrong, `strategy`
    what the service undid, and `next_step_id` which step to send next (0: the
    transaction ended, see `abort_reason`).
    """

    step_id: int
    tool: str
    status: StepStatus
    output: Any
    output_json: str
    category: str
    hint: str
    strategy: Strategy
    rollback_to_step: int
    next_step_id: int
    constraints: tuple[str, ...]
    context_reset: bool
    abort_reason: str
    compensation_errors: tuple[str, ...]
    rollback_latency_ms: float

    @property
    def ok(self) -> bool:
        return self.status is StepStatus.SUCCESS

    @property
    def ended(self) -> bool:
        """The service ended the transaction (ABORT): nothing of it remains."""
        return self.next_step_id == 0


@dataclass(frozen=True)
class ContextEntry:
    step_id: int
    tool_name: str
    raw_context: str


@dataclass(frozen=True)
class TransactionState:
    """`tx.get()`: GetTransaction's fields as attributes. `created_at` / `updated_at` are
    unix seconds (0.0 when the service does not report them)."""

    transaction_id: str
    status: TransactionStatus
    next_step_id: int
    constraints: tuple[str, ...]
    global_resets: int
    context: tuple[ContextEntry, ...]
    agent_id: str
    principal: str
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class CommitResult:
    """What `tx.commit()` returns. `committed` True: every live step applied and
    `status` is COMMITTED. When the transaction has steps that need a person's approval,
    nothing was committed: `awaiting_approval` is True, `approval_digest` names what is
    to be approved and `status` is AWAITING_APPROVAL.

    `tx.commit(wait_for_approval=SECONDS)` then waits (reading the history, with
    backoff) until an approver decided: `status` is COMMITTED (`committed` True,
    `steps_committed` and `effects` from the history; effects delivered by the approver's
    call are not counted in `effects_dispatched`), REJECTED (rejected, or the approval
    timed out) or ABORTED (approved, but a key it read or wrote was committed by another
    transaction meanwhile; compensated), with `history` saying who decided and why;
    still AWAITING_APPROVAL when the wait ran out (the decision is then in
    `client.history(tx.id)` later)."""

    committed: bool
    steps_committed: int
    effects_dispatched: int
    dispatch_errors: tuple[str, ...]
    awaiting_approval: bool = False
    approval_digest: str = ""
    status: TransactionStatus = TransactionStatus.UNSPECIFIED
    history: TransactionHistory | None = None

    def __post_init__(self) -> None:
        if self.status is TransactionStatus.UNSPECIFIED:
            status = (TransactionStatus.COMMITTED if self.committed
                      else TransactionStatus.AWAITING_APPROVAL if self.awaiting_approval
                      else TransactionStatus.UNSPECIFIED)
            object.__setattr__(self, "status", status)


@dataclass(frozen=True)
class RollbackResult:
    """`rolled_back` False means an undo failed: `compensation_errors` says which, and the
    transaction waits (AWAITING_ROLLBACK) until a rollback succeeds."""

    rolled_back: bool
    next_step_id: int
    compensations_run: int
    compensation_errors: tuple[str, ...]


@dataclass(frozen=True)
class TransactionSummary:
    """One row of `client.list_transactions()`."""

    transaction_id: str
    status: TransactionStatus
    agent_id: str
    principal: str
    next_step_id: int
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class ToolInfo:
    """One tool the caller may use (`client.tools()`): `kind` is journal, saga, effect,
    read or deferred; `toolset` is "<namespace>/<name>" for a toolset's tool, "" for the
    built-ins and plug-ins; `input_schema` is its arguments' JSON Schema."""

    name: str
    description: str
    input_schema: Mapping[str, Any]
    kind: str
    toolset: str = ""


@dataclass(frozen=True)
class DeadLetter:
    """A committed effect (or deferred toolset call) its receiver refused for good,
    waiting for an admin (`retry_dead_letter` / `discard_dead_letter`). `channel` is the
    effect's channel or the deferred call's tool; `kind` is `effect` or `deferred`;
    `attempts` counts every delivery attempt, the one made at commit included;
    `dead_at` is unix seconds; `principal` owns the idempotency key ("" without
    authentication)."""

    idempotency_key: str
    transaction_id: str
    channel: str
    kind: str
    last_error: str
    attempts: int
    dead_at: float
    principal: str = ""


@dataclass(frozen=True)
class DeadLetterPage:
    dead_letters: tuple[DeadLetter, ...] = field(default_factory=tuple)
    next_page_token: str = ""


@dataclass(frozen=True)
class HistoryStep:
    """One step sent to a transaction, failed attempts included (a step id repeats when
    it was retried). `arguments_json` / `output_json` are at most 4096 bytes of UTF-8,
    a longer text cut and ended with "…"; `at` is unix seconds."""

    step_id: int
    tool: str
    status: StepStatus
    category: str
    hint: str
    strategy: Strategy
    at: float
    arguments_json: str
    output_json: str

    @property
    def ok(self) -> bool:
        return self.status is StepStatus.SUCCESS


@dataclass(frozen=True)
class TransactionHistory:
    """`client.history(tx_id)`: what happened to a transaction, open or ended (kept for
    the service's --history-retention-s after it ends). `ended_at` is 0 and `ended_by`
    "" while it is open; `ended_by` is the principal that ended it ("" without
    authentication) or "reaper"; `reason` the abort reason or the rollback's reason
    ("" on commit); `steps_committed` and `effects` are what the commit applied (0
    unless COMMITTED)."""

    transaction_id: str
    status: TransactionStatus
    agent_id: str
    principal: str
    created_at: float
    ended_at: float
    ended_by: str
    reason: str
    steps_committed: int
    effects: int
    steps: tuple[HistoryStep, ...]

    @property
    def ended(self) -> bool:
        return self.status.ended


@dataclass(frozen=True)
class TransactionPage:
    transactions: tuple[TransactionSummary, ...] = field(default_factory=tuple)
    next_page_token: str = ""


@dataclass(frozen=True)
class ServiceStatus:
    """`client.status()`: a summary of the deployment for status displays. The counts
    are the whole deployment's (every principal's) and 0 when `etcd_reachable` is False
    (the replica that answered could not reach etcd); `principal` and `admin` say who
    the service took the caller for ("" and True without authentication)."""

    etcd_reachable: bool
    open_transactions: int
    outbox_depth: int
    dead_letters: int
    approvals_pending: int
    replica_id: str
    version: str
    principal: str = ""
    admin: bool = False


@dataclass(frozen=True)
class GatedStep:
    """One step of a pending approval: a call whose tool needs approval (`channel` ""),
    or an `effect.stage` on a gated channel. `arguments` is what it was called with,
    references resolved (an effect: its payload); `arguments_json` the same as sent."""

    step_id: int
    tool: str
    channel: str
    arguments_json: str

    @property
    def arguments(self) -> Any:
        return json.loads(self.arguments_json) if self.arguments_json else None


@dataclass(frozen=True)
class Approval:
    """A transaction awaiting a person's approval (`client.approvals()`): who began it,
    the steps that need approval, the keys its commit writes, and `digest`, which
    `client.approve(...)` must name: approving binds to exactly this. Times are unix
    seconds; at `expires_at` the service rejects it."""

    transaction_id: str
    principal: str
    agent_id: str
    digest: str
    gated: tuple[GatedStep, ...]
    write_keys: tuple[str, ...]
    requested_at: float
    expires_at: float


@dataclass(frozen=True)
class ApprovalPage:
    approvals: tuple[Approval, ...] = field(default_factory=tuple)
    next_page_token: str = ""


@dataclass(frozen=True)
class Decision:
    """What `client.approve(...)` / `client.reject(...)` return: `status` is COMMITTED
    (approved and committed now; `effects_dispatched` delivered during the call,
    `dispatch_errors` retried in the background), REJECTED, or ABORTED (approved, but
    another transaction had committed a key this one read or wrote: compensated)."""

    status: TransactionStatus
    steps_committed: int = 0
    effects_dispatched: int = 0
    dispatch_errors: tuple[str, ...] = ()

    @property
    def committed(self) -> bool:
        return self.status is TransactionStatus.COMMITTED


__all__ = [
    "Approval", "ApprovalPage", "CommitResult", "ContextEntry", "DeadLetter", "DeadLetterPage",
    "Decision", "GatedStep", "HistoryStep", "Policy", "ServiceStatus",
    "RollbackResult", "StepResult", "StepStatus", "Strategy", "ToolInfo", "TransactionHistory",
    "TransactionPage", "TransactionState", "TransactionStatus", "TransactionSummary",
]
