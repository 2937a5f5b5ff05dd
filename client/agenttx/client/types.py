"""What `agenttx.client` returns: plain, immutable Python values.

Why not the protobuf messages: users should not depend on generated code (field names
stay, but presence rules, enum prefixes and repeated-field types are wire details), and
a frozen dataclass prints, compares and type-checks. Enums are `StrEnum`s whose values
are the wire names without their prefix (`Strategy.LOCAL_BACKTRACK == "LOCAL_BACKTRACK"`).

Pure: no I/O and no protobuf import here (conversion lives in `_core`).
"""

from __future__ import annotations

import enum
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
    """Open transactions are ACTIVE or AWAITING_ROLLBACK; ended ones answer NOT_FOUND."""

    UNSPECIFIED = "UNSPECIFIED"
    ACTIVE = "ACTIVE"
    AWAITING_ROLLBACK = "AWAITING_ROLLBACK"
    COMMITTED = "COMMITTED"
    ABORTED = "ABORTED"
    EXPIRED = "EXPIRED"


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
    committed: bool
    steps_committed: int
    effects_dispatched: int
    dispatch_errors: tuple[str, ...]


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
class TransactionPage:
    transactions: tuple[TransactionSummary, ...] = field(default_factory=tuple)
    next_page_token: str = ""


__all__ = [
    "CommitResult", "ContextEntry", "DeadLetter", "DeadLetterPage", "Policy", "RollbackResult",
    "StepResult", "StepStatus",
    "Strategy", "ToolInfo", "TransactionPage", "TransactionState", "TransactionStatus", "TransactionSummary",
]
