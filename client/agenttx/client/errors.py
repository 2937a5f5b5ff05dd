"""Exceptions raised by `agenttx.client`: one class per gRPC status the service answers.

Why typed errors: an agent loop must tell "my commit lost a race, redo the work"
(`Conflict`) from "the transaction is gone" (`NotFound`) from "the service is down"
(`Unavailable`) without parsing messages. Every class derives from `AgentTxError`, whose
`.code` is the `grpc.StatusCode` and `.details` the service's message.

`OutcomeUnknown` is not a status of its own: it is raised instead of `Unavailable` /
`DeadlineExceeded` when the call was a step, a commit or a rollback, whose effect may or
may not have happened. It carries what a re-read of the transaction showed, so the caller
decides; the client retries none of these by itself, except a step the re-read proved
had not applied (re-sent once; `OutcomeUnknown` if that answer is lost too).

This module must never import the generated protobuf code: these are the names users
catch, and they stay stable when the wire format grows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import grpc

if TYPE_CHECKING:
    from .types import RollbackResult, StepResult, Strategy, TransactionHistory, TransactionState


class AgentTxError(Exception):
    """Base of every error `agenttx.client` raises. `.code` is a `grpc.StatusCode`.

    >>> try:
    ...     client.get("5b1c…")
    ... except AgentTxError as err:
    ...     print(err.code.name, err.details)
    NOT_FOUND transaction '5b1c…' not found (not a transaction id)
    """

    default_code: ClassVar[grpc.StatusCode] = grpc.StatusCode.UNKNOWN

    def __init__(self, details: str, *, code: grpc.StatusCode | None = None) -> None:
        super().__init__(details)
        self.details = details
        self.code: grpc.StatusCode = code if code is not None else self.default_code

    def __str__(self) -> str:
        return f"{self.code.name}: {self.details}"


class InvalidArgument(AgentTxError):
    """The request was malformed (missing id, oversized field, policy out of range); nothing changed."""

    default_code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(AgentTxError):
    """Unknown or ended transaction (committed, aborted, expired, or another principal's)."""

    default_code = grpc.StatusCode.NOT_FOUND


class TransactionEnded(NotFound):
    """The service ended the transaction (an ABORT strategy, the idle reaper, an admin's
    rollback, a rejected approval): nothing of it was committed.

    Raised when a `with client.transaction()` block is left normally after that
    happened, with `.history` the transaction's `TransactionHistory` (how it ended, who
    ended it and why, every step sent), or None when the history could not be read.
    Also raised, without a call and with no history, for a step on a transaction this
    client saw end."""

    def __init__(self, details: str, *, code: grpc.StatusCode | None = None,
                 transaction_id: str = "", history: TransactionHistory | None = None) -> None:
        super().__init__(details, code=code)
        self.transaction_id = transaction_id
        self.history = history


class StepFailed(AgentTxError):
    """A step failed and nobody said the failure was handled.

    Raised when a `with client.transaction()` block is left normally after a step answer
    in it was a failure (the client rolls the transaction back first: work whose author
    may not have looked at a failure is never committed; call `tx.commit()` yourself
    when your code recovered), and, with `strict=True`, by the failing `tx.step(...)`
    itself (the transaction then stays open).

    `.result` is the first failing `StepResult`; `.hint`, `.category` and `.strategy`
    are its; `.rollback` the `RollbackResult` of the client's rollback when leaving the
    block (None with strict). `.code` is OK: the RPC succeeded, the step did not."""

    default_code = grpc.StatusCode.OK

    def __init__(self, result: StepResult, *, rollback: RollbackResult | None = None) -> None:
        where = f"step {result.step_id} ({result.tool}) failed: {result.category}: {result.hint}"
        super().__init__(where)
        self.result = result
        self.rollback = rollback

    @property
    def hint(self) -> str:
        return self.result.hint

    @property
    def category(self) -> str:
        return self.result.category

    @property
    def strategy(self) -> Strategy:
        return self.result.strategy

    def __str__(self) -> str:
        return self.details


class FailedPrecondition(AgentTxError):
    """Wrong step order, or the transaction is not active (e.g. waiting for a manual rollback)."""

    default_code = grpc.StatusCode.FAILED_PRECONDITION


class Conflict(AgentTxError):
    """Commit lost a write-write race (ABORTED). The service compensated and ended the
    transaction: it is gone, and the work must be redone in a new transaction."""

    default_code = grpc.StatusCode.ABORTED


class Unavailable(AgentTxError):
    """The service (or its etcd) could not be reached."""

    default_code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(AgentTxError):
    """The call did not finish within its timeout."""

    default_code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unauthenticated(AgentTxError):
    """Missing, invalid or expired credentials (see `Client(token=...)`)."""

    default_code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(AgentTxError):
    """The caller is authenticated but may not do this."""

    default_code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(AgentTxError):
    """A quota was hit (open transactions or requests per second); the details say which."""

    default_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Internal(AgentTxError):
    """A storage or I/O failure inside the service; nothing partial was left behind."""

    default_code = grpc.StatusCode.INTERNAL


class Cancelled(AgentTxError):
    """The call was cancelled before it finished."""

    default_code = grpc.StatusCode.CANCELLED


class OutcomeUnknown(AgentTxError):
    """A step, commit or rollback ended in UNAVAILABLE or DEADLINE_EXCEEDED: it may or may
    not have taken effect. The client re-read the transaction and reports what it saw:

    - `state`: the `TransactionState` the re-read returned, or None;
    - `ended`: True when the re-read answered NOT_FOUND (the transaction no longer exists);
    - `reread_error`: the error of the re-read itself, when it failed too.

    `code` is the status of the original call.
    """

    def __init__(self, details: str, *, code: grpc.StatusCode, rpc: str, transaction_id: str,
                 step_id: int | None = None, state: TransactionState | None = None,
                 ended: bool = False, reread_error: AgentTxError | None = None) -> None:
        super().__init__(details, code=code)
        self.rpc = rpc
        self.transaction_id = transaction_id
        self.step_id = step_id
        self.state = state
        self.ended = ended
        self.reread_error = reread_error


_BY_CODE: dict[grpc.StatusCode, type[AgentTxError]] = {
    cls.default_code: cls
    for cls in (InvalidArgument, NotFound, FailedPrecondition, Conflict, Unavailable,
                DeadlineExceeded, Unauthenticated, PermissionDenied, ResourceExhausted,
                Internal, Cancelled)
}


def from_rpc_error(err: Any) -> AgentTxError:
    """The typed error for a `grpc.RpcError` (sync or asyncio)."""
    code = err.code() if callable(getattr(err, "code", None)) else grpc.StatusCode.UNKNOWN
    details = (err.details() if callable(getattr(err, "details", None)) else None) or str(err)
    cls = _BY_CODE.get(code, AgentTxError)
    return cls(details, code=code)


__all__ = [
    "AgentTxError", "Cancelled", "Conflict", "DeadlineExceeded", "FailedPrecondition",
    "Internal", "InvalidArgument", "NotFound", "OutcomeUnknown", "PermissionDenied",
    "ResourceExhausted", "StepFailed", "TransactionEnded", "Unauthenticated", "Unavailable",
    "from_rpc_error",
]
