"""Everything `Client` and `AsyncClient` decide, written once, as generators of calls.

Why: the blocking and the asyncio clients must behave identically (what is retried,
what a lost answer means, what leaving a `with` block does), and two hand-written copies
drift. So each operation is a *flow*: a generator that yields the RPCs it needs as
`Call`s and receives each answer (or has the error thrown in), and the pauses it needs
as `Sleep`s (waiting for an approval). `Client._drive` runs a flow with blocking calls
and `time.sleep`, `AsyncClient._drive` with awaited ones and `asyncio.sleep`; neither
holds any rule of its own. Pure: no I/O, no gRPC channel here (the clock is read to
know when a wait runs out).

The rules (docs/client.md):
- reads are tried on each replica in turn while they do not answer;
- a step whose answer was lost is re-sent once, only when a re-read proves it did not
  apply; a commit, a rollback or a step that may have applied is never retried and
  raises `OutcomeUnknown` with what the re-read saw;
- leaving a transaction block normally: after an explicit commit or abort, nothing; if
  the service ended the transaction, `TransactionEnded` with its history; if a step
  answer in the block failed, roll back and raise `StepFailed`; else commit. Leaving it
  by an exception aborts and re-raises.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import grpc

from ..v1 import agenttx_pb2 as pb
from . import _core
from .errors import (
    AgentTxError,
    InvalidArgument,
    NotFound,
    OutcomeUnknown,
    StepFailed,
    TransactionEnded,
)
from .types import (
    ApprovalPage,
    CommitResult,
    DeadLetterPage,
    Decision,
    Policy,
    RollbackResult,
    ServiceStatus,
    StepResult,
    ToolInfo,
    TransactionHistory,
    TransactionPage,
    TransactionState,
    TransactionStatus,
)

log = logging.getLogger("agenttx.client")

T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    """One RPC a flow needs: the driver sends it and hands back the response message,
    or throws the typed `AgentTxError` into the flow."""

    method: str
    request: Any
    timeout: float | None = None


@dataclass(frozen=True)
class Sleep:
    """A pause a flow needs (the driver sleeps, then resumes the flow with None)."""

    seconds: float


Flow = Generator[Call | Sleep, Any, T]

# Waiting for an approval (`tx.commit(wait_for_approval=...)`): the history is read
# after FIRST_POLL_S, then at intervals growing by POLL_GROWTH up to MAX_POLL_S.
FIRST_POLL_S = 0.2
POLL_GROWTH = 1.5
MAX_POLL_S = 5.0


# ---- input checks (the same wording a user sees from both clients) --------------------

def _check_id(value: object, what: str = "transaction_id") -> str:
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{what} must be a non-empty string (a transaction id), "
                              f"not {value!r}")
    return value


def _check_step_id(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"{what} must be an integer >= 1, not {value!r}")
    return value


def check_to_step(value: object) -> int | None:
    """RollbackTransaction's `to_step`: None or 0 aborts, k >= 1 rewinds to before
    step k; anything else is refused before any call."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(f"to_step must be an integer >= 1 (or None / 0 to abort), "
                              f"not {value!r}")
    return value


def _check_step(tool: object, args: object, context: object) -> None:
    if not isinstance(tool, str) or not tool:
        raise InvalidArgument(f"tool must be a non-empty string such as \"kv.put\", not "
                              f"{tool!r}")
    if args is not None and not isinstance(args, str | Mapping):
        raise InvalidArgument(f"args must be a dict (or a JSON object already encoded as a "
                              f"str), not {type(args).__name__}")
    if not isinstance(context, str):
        raise InvalidArgument(f"context must be a string, not {type(context).__name__}")


def _check_begin(agent_id: object, metadata: object) -> None:
    if not isinstance(agent_id, str):
        raise InvalidArgument(f"agent_id must be a string, not {type(agent_id).__name__}")
    if metadata is not None and not (isinstance(metadata, Mapping) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise InvalidArgument("metadata must map strings to strings")


# ---- client-level flows --------------------------------------------------------------

def read(method: str, request: Any, targets: int) -> Flow[Any]:
    """A read: tried on each replica in turn while they do not answer (the driver moves
    to the next replica after UNAVAILABLE / DEADLINE_EXCEEDED)."""
    for left in reversed(range(targets)):
        try:
            return (yield Call(method, request))
        except AgentTxError as err:
            if left == 0 or err.code not in _core.UNKNOWN_OUTCOME_CODES:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def begin(agent_id: str, metadata: Mapping[str, str] | None,
          policy: Policy | Mapping[str, Any] | None) -> Flow[tuple[str, int]]:
    _check_begin(agent_id, metadata)
    try:
        request = _core.begin_request(agent_id, metadata, policy)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"policy: {exc}") from None
    resp = yield Call("BeginTransaction", request)
    return resp.transaction_id, resp.next_step_id


def get(transaction_id: str, targets: int) -> Flow[TransactionState]:
    _check_id(transaction_id)
    resp = yield from read("GetTransaction",
                           pb.GetTransactionRequest(transaction_id=transaction_id), targets)
    return _core.transaction_state(resp)


def history(transaction_id: str, targets: int) -> Flow[TransactionHistory]:
    _check_id(transaction_id)
    resp = yield from read("GetTransactionHistory",
                           pb.GetTransactionHistoryRequest(transaction_id=transaction_id),
                           targets)
    return _core.transaction_history(resp)


def rollback(transaction_id: str, to_step: int | None, reason: str) -> Flow[RollbackResult]:
    _check_id(transaction_id)
    to_step = check_to_step(to_step)
    resp = yield Call("RollbackTransaction",
                      _core.rollback_request(transaction_id, to_step, reason))
    return _core.rollback_result(resp)


def tools(targets: int) -> Flow[list[ToolInfo]]:
    resp = yield from read("ListTools", pb.ListToolsRequest(), targets)
    return _core.tool_infos(resp)


def list_page(page_size: int, page_token: str, status: TransactionStatus | str | None,
              agent_id_prefix: str, targets: int) -> Flow[TransactionPage]:
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise InvalidArgument(f"page_size must be an integer >= 1, not {page_size!r}")
    resp = yield from read("ListTransactions", _core.list_request(
        page_size, page_token, status, agent_id_prefix), targets)
    return _core.transaction_page(resp)


def dead_letters_page(page_size: int, page_token: str, targets: int) -> Flow[DeadLetterPage]:
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise InvalidArgument(f"page_size must be an integer >= 1, not {page_size!r}")
    resp = yield from read("ListDeadLetters",
                           _core.dead_letters_request(page_size, page_token), targets)
    return _core.dead_letter_page(resp)


def dead_letter_action(method: str, idempotency_key: str, reason: str,
                       principal: str) -> Flow[None]:
    """RetryDeadLetter / DiscardDeadLetter: never retried on a lost answer (list the dead
    letters to see whether it applied)."""
    if not isinstance(idempotency_key, str) or not idempotency_key:
        raise InvalidArgument(f"idempotency_key must be a non-empty string, not "
                              f"{idempotency_key!r}")
    if method == "DiscardDeadLetter" and (not isinstance(reason, str) or not reason.strip()):
        raise InvalidArgument("discarding a dead letter needs a reason (it is audited)")
    yield Call(method, _core.dead_letter_request(idempotency_key, reason, principal))


def status(targets: int) -> Flow[ServiceStatus]:
    resp = yield from read("GetServiceStatus", pb.GetServiceStatusRequest(), targets)
    return _core.service_status(resp)


def approvals_page(page_size: int, page_token: str, targets: int) -> Flow[ApprovalPage]:
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise InvalidArgument(f"page_size must be an integer >= 1, not {page_size!r}")
    resp = yield from read("ListApprovals", _core.approvals_request(page_size, page_token),
                           targets)
    return _core.approval_page(resp)


def decide(transaction_id: str, digest: str, approve: bool, reason: str) -> Flow[Decision]:
    """DecideApproval: never retried on a lost answer (the decision may have applied:
    `history()` or the approvals list says)."""
    _check_id(transaction_id)
    if approve and (not isinstance(digest, str) or not digest):
        raise InvalidArgument("approving needs the digest ListApprovals shows (you approve "
                              "exactly what you saw)")
    if not isinstance(reason, str):
        raise InvalidArgument(f"reason must be a string, not {type(reason).__name__}")
    if not approve and not reason.strip():
        raise InvalidArgument("rejecting needs a reason (it goes into the history and the "
                              "audit log)")
    resp = yield Call("DecideApproval",
                      _core.decide_request(transaction_id, digest, approve, reason))
    return _core.decision(resp)


def _check_wait(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise InvalidArgument(f"wait_for_approval must be a number of seconds >= 0 (or "
                              f"None), not {value!r}")
    return float(value)


def wait_for_decision(transaction_id: str, pending: CommitResult, seconds: float,
                      targets: int) -> Flow[CommitResult]:
    """After a commit that awaits approval: read the history, with growing pauses, until
    it shows the decision or `seconds` ran out (then `pending` as it was)."""
    deadline = time.monotonic() + seconds
    pause = FIRST_POLL_S
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return pending
        yield Sleep(min(pause, left))
        pause = min(pause * POLL_GROWTH, MAX_POLL_S)
        found = yield from history(transaction_id, targets)
        if found.status is TransactionStatus.AWAITING_APPROVAL:
            continue
        if not found.ended:  # a manual rollback is pending (its undo failed): still open
            return CommitResult(False, 0, 0, pending.dispatch_errors, False,
                                pending.approval_digest, found.status, found)
        committed = found.status is TransactionStatus.COMMITTED
        return CommitResult(committed, found.steps_committed if committed else 0, 0, (),
                            False, pending.approval_digest, found.status, found)


def attach_state(transaction_id: str, next_step_id: int | None) -> None:
    _check_id(transaction_id)
    if next_step_id is not None:
        _check_step_id(next_step_id, "next_step_id")


# ---- one transaction ------------------------------------------------------------------

class ClientSettings(Protocol):
    """What a transaction needs to know of its client (`Client` and `AsyncClient` are
    both one)."""

    resend_lost_steps: bool
    resent_steps: int

    @property
    def target(self) -> str: ...

    @property
    def targets(self) -> tuple[str, ...]: ...


class TxCore:
    """The step id tracking and end-of-block rules of one transaction, as flows."""

    def __init__(self, client: ClientSettings, tx_id: str, next_step_id: int, *,
                 hints_seen: int | None = 0, strict: bool = False) -> None:
        self.client = client
        self.id = tx_id
        self.next_step_id = next_step_id
        self.strict = strict
        # How many constraints (distinct hints) the last answer carried; None: unknown.
        self.hints_seen = hints_seen
        self.closed = False      # this object committed or aborted it (explicitly)
        self.ended = False       # the service ended it (abort, reaper, conflict, admin)
        self.first_failure: StepResult | None = None

    @property
    def finished(self) -> bool:
        return self.closed or self.ended

    # -- bookkeeping
    def _check_open(self) -> None:
        if self.finished or self.next_step_id == 0:
            raise TransactionEnded(f"transaction {self.id} has ended; begin a new one",
                                   transaction_id=self.id)

    def _after_state(self, state: TransactionState) -> None:
        self.next_step_id = state.next_step_id
        self.hints_seen = len(state.constraints)

    def _fail(self, err: AgentTxError) -> AgentTxError:
        """NOT_FOUND, a commit conflict and an ended re-read all mean: the transaction is
        gone (the service ended it)."""
        if isinstance(err, NotFound) or err.code == grpc.StatusCode.ABORTED or \
                (isinstance(err, OutcomeUnknown) and err.ended):
            self.ended = True
        elif isinstance(err, OutcomeUnknown) and err.state is not None:
            self._after_state(err.state)
        return err

    def _reread(self, rpc: str, cause: AgentTxError, step_id: int | None = None,
                resend_error: AgentTxError | None = None) -> Flow[OutcomeUnknown]:
        try:
            reread: TransactionState | AgentTxError = yield from get(
                self.id, len(self.client.targets))
        except AgentTxError as err:
            reread = err
        return _core.reread_outcome(rpc, self.id, cause, reread, step_id=step_id,
                                    resend_error=resend_error)

    # -- the operations
    def step(self, tool: str, args: Mapping[str, Any] | str | None, context: str,
             timeout: float | None) -> Flow[StepResult]:
        _check_step(tool, args, context)
        self._check_open()
        step_id = self.next_step_id
        try:
            request = _core.step_request(self.id, step_id, tool, args, context)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"args cannot be sent as JSON: {exc}") from None
        try:
            resp = yield Call("ExecuteStep", request, timeout)
        except AgentTxError as err:
            if err.code not in _core.UNKNOWN_OUTCOME_CODES:
                raise self._fail(err) from None
            resp = yield from self._resend_lost(request, step_id, err, timeout)
        result = _core.step_result(resp, step_id, tool)
        self.next_step_id = result.next_step_id
        self.hints_seen = len(result.constraints)
        if result.ended:
            self.ended = True
        if not result.ok:
            if self.first_failure is None:
                self.first_failure = result
            if self.strict:
                raise StepFailed(result)
        return result

    def _resend_lost(self, request: Any, step_id: int, cause: AgentTxError,
                     timeout: float | None) -> Flow[Any]:
        """The answer to step `step_id` was lost: re-read, and send the step once more if
        the re-read proves it did not apply; otherwise raise `OutcomeUnknown`."""
        seen = yield from self._reread("ExecuteStep", cause, step_id)
        if not (self.client.resend_lost_steps and seen.state is not None
                and _core.may_resend(seen.state, step_id, self.hints_seen)):
            raise self._fail(seen) from None
        self.client.resent_steps += 1
        log.info("re-sending step %d of transaction %s to %s after %s", step_id, self.id,
                 self.client.target, cause.code.name)
        try:
            return (yield Call("ExecuteStep", request, timeout))
        except AgentTxError as again:
            if again.code not in _core.UNKNOWN_OUTCOME_CODES | _core.MOVED_ON_CODES:
                raise self._fail(again) from None
            lost = yield from self._reread("ExecuteStep", cause, step_id, again)
            raise self._fail(lost) from None

    def get(self) -> Flow[TransactionState]:
        try:
            state = yield from get(self.id, len(self.client.targets))
        except AgentTxError as err:
            raise self._fail(err) from None
        self._after_state(state)
        return state

    def history(self) -> Flow[TransactionHistory]:
        return (yield from history(self.id, len(self.client.targets)))

    def commit(self, timeout: float | None,
               wait_for_approval: float | None = None) -> Flow[CommitResult]:
        """A transaction the service ended (known here, or answered NOT_FOUND) raises
        `TransactionEnded` with its history; a lost race raises `Conflict`. When the
        commit awaits approval and `wait_for_approval` is given, wait that many seconds
        at most for the decision (`wait_for_decision`)."""
        wait = _check_wait(wait_for_approval)
        if self.ended:
            self.closed = True
            raise (yield from self._ended())
        try:
            resp = yield Call("CommitTransaction",
                              pb.CommitTransactionRequest(transaction_id=self.id), timeout)
        except AgentTxError as err:
            if err.code in _core.UNKNOWN_OUTCOME_CODES:
                err = yield from self._reread("CommitTransaction", err)
            self._fail(err)
            if self.ended:
                self.closed = True  # an explicit commit: the caller sees how it ended
            if type(err) is NotFound:
                raise (yield from self._ended()) from None
            raise err from None
        self.closed = True
        result = _core.commit_result(resp)
        if result.awaiting_approval and wait:
            result = yield from wait_for_decision(self.id, result, wait,
                                                  len(self.client.targets))
        return result

    def rollback(self, to_step: int | None, reason: str,
                 timeout: float | None) -> Flow[RollbackResult]:
        to_step = check_to_step(to_step)
        try:
            resp = yield Call("RollbackTransaction",
                              _core.rollback_request(self.id, to_step, reason), timeout)
        except AgentTxError as err:
            if err.code in _core.UNKNOWN_OUTCOME_CODES:
                err = yield from self._reread("RollbackTransaction", err)
            raise self._fail(err) from None
        result = _core.rollback_result(resp)
        self.next_step_id = result.next_step_id
        if result.rolled_back and not to_step:
            self.closed = True
        return result

    # -- leaving a `with` block
    def exit(self, exc_type: type[BaseException] | None,
             exc: BaseException | None) -> Flow[None]:
        if self.closed:
            return
        if exc_type is not None:
            if not self.ended:
                yield from self._abort_after(exc_type, exc)
            return
        if self.ended:
            raise (yield from self._ended())
        if self.first_failure is not None:
            failure = self.first_failure
            try:
                result = yield from self.rollback(None, _FAILED_REASON, None)
            except NotFound:
                raise (yield from self._ended()) from None
            except AgentTxError as err:
                error = StepFailed(failure)
                error.add_note(f"agenttx: rolling back transaction {self.id} failed ({err}); "
                               "it stays open until it is rolled back or expires")
                raise error from None
            error = StepFailed(failure, rollback=result)
            if not result.rolled_back:
                error.add_note(f"agenttx: the rollback of transaction {self.id} is "
                               f"incomplete: {'; '.join(result.compensation_errors)}")
            raise error
        yield from self.commit(None)

    def _abort_after(self, exc_type: type[BaseException],
                     exc: BaseException | None) -> Flow[None]:
        reason = f"agenttx.client: exception {exc_type.__name__} left the transaction block"
        try:
            result = yield from self.rollback(None, reason, None)
        except NotFound:
            return  # already gone: nothing left to undo
        except AgentTxError as err:
            _note(exc, f"agenttx: aborting transaction {self.id} after this exception "
                       f"failed: {err}")
            return
        if not result.rolled_back:
            _note(exc, f"agenttx: aborting transaction {self.id} after this exception "
                       f"failed: {'; '.join(result.compensation_errors)}")

    def _ended(self) -> Flow[TransactionEnded]:
        """The error for a transaction the service ended, with its history."""
        self.ended = True
        try:
            found: TransactionHistory | None = yield from self.history()
        except AgentTxError as err:
            found, why = None, f"; its history could not be read ({err})"
        else:
            why = ""
        if found is not None and found.status is TransactionStatus.COMMITTED:
            n = found.steps_committed
            what = f"transaction {self.id} was already committed ({n} step{'s' * (n != 1)})"
        elif found is not None:
            by = f" by {found.ended_by}" if found.ended_by else ""
            because = f": {found.reason}" if found.reason else ""
            what = (f"transaction {self.id} was ended by the service "
                    f"({found.status.value}{by}{because}); nothing of it was committed")
        else:
            what = f"transaction {self.id} was ended by the service{why}"
        return TransactionEnded(what, transaction_id=self.id, history=found)


_FAILED_REASON = ("agenttx.client: a step failed and the block was left without "
                  "tx.commit()")


def _note(exc: BaseException | None, text: str) -> None:
    if exc is not None:
        exc.add_note(text)


__all__ = ["Call", "ClientSettings", "Flow", "Sleep", "TxCore", "approvals_page",
           "attach_state", "begin", "check_to_step", "decide", "get", "history", "list_page",
           "read", "rollback", "status", "tools", "wait_for_decision"]
