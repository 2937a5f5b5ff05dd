"""`Client` and `Transaction`: the blocking front end (grpcio's sync channel).

Must never retry a commit or a rollback, nor re-send a step a re-read has not cleared
(see `_core`), and must never leave a transaction open by accident: leaving a `with`
block by an exception aborts it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

import grpc

from ..v1 import agenttx_pb2 as pb
from ..v1 import agenttx_pb2_grpc as pb_grpc
from . import _core
from ._core import TLS, TxState
from .errors import AgentTxError, NotFound, OutcomeUnknown, from_rpc_error
from .types import (
    CommitResult,
    DeadLetter,
    DeadLetterPage,
    Policy,
    RollbackResult,
    StepResult,
    ToolInfo,
    TransactionPage,
    TransactionState,
    TransactionStatus,
    TransactionSummary,
)

log = logging.getLogger("agenttx.client")


class Client(_core.HasEndpoints):
    """A connection to an AgentTx service.

    >>> from agenttx.client import Client
    >>> with Client("127.0.0.1:50051") as client:
    ...     with client.transaction(agent_id="billing-agent") as tx:
    ...         tx.step("kv.put", {"key": "invoice-7", "value": {"total": 42}})
    ...         r = tx.step("kv.get", {"key": "customer-9"})
    ...         if not r.ok:
    ...             print(r.category, r.hint, r.strategy, r.next_step_id)
    ...     # leaving the block committed the transaction

    `target` is `host:port` (any gRPC target: a Kubernetes Service, a load balancer), or a
    list of them, one per replica: the client talks to the first and moves to the next
    when a call ends in UNAVAILABLE or DEADLINE_EXCEEDED (`.target` is the one in use).
    Without `tls` the channel is plaintext; `tls=True` verifies the server against the
    system roots, `tls=TLS(ca=..., cert=..., key=...)` against a private CA and with a
    client certificate (mTLS). `token` is sent as `authorization: Bearer <token>` on every
    call. `timeout` (seconds) bounds each call.

    A step whose answer is lost is re-sent once when a re-read of the transaction proves
    it did not apply (`resend_lost_steps=False` turns that off); `resent_steps` counts
    those re-sends. Commits and rollbacks are never retried.
    """

    def __init__(self, target: str | Sequence[str] = _core.DEFAULT_TARGET, *,
                 token: str | None = None, tls: bool | TLS | None = None,
                 timeout: float | None = _core.DEFAULT_TIMEOUT_S,
                 options: list[tuple[str, Any]] | None = None,
                 resend_lost_steps: bool = True) -> None:
        self._endpoints = _core.Endpoints(target)
        self.timeout = timeout
        self.resend_lost_steps = resend_lost_steps
        self.resent_steps = 0
        self._tls = _core.resolve_tls(tls)
        self._metadata = _core.call_metadata(token)
        self._options = _core.channel_options(self._tls, options or ())
        self._channels: dict[str, tuple[grpc.Channel, pb_grpc.AgentTxServiceStub]] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._stub()  # fail on a bad target or TLS setting now, not at the first call

    # -- plumbing
    def _stub(self) -> pb_grpc.AgentTxServiceStub:
        target = self.target
        opened = self._channels.get(target)  # every call: no lock once the channel exists
        if opened is not None:
            return opened[1]
        with self._lock:
            if self._closed:
                raise ValueError("this agenttx Client is closed")
            if target not in self._channels:
                if self._tls is None:
                    channel = grpc.insecure_channel(target, options=self._options)
                else:
                    channel = grpc.secure_channel(target, self._tls.credentials(),
                                                  options=self._options)
                self._channels[target] = (channel, pb_grpc.AgentTxServiceStub(channel))
            return self._channels[target][1]

    def _call(self, method: str, request: Any, timeout: float | None = None) -> Any:
        try:
            return getattr(self._stub(), method)(
                request, timeout=self.timeout if timeout is None else timeout,
                metadata=self._metadata)
        except grpc.RpcError as rpc_error:
            err = from_rpc_error(rpc_error)
        self._endpoints.after_error(err.code)
        raise err

    def _read(self, method: str, request: Any) -> Any:
        """A read: tried on each replica in turn while they do not answer."""
        for left in reversed(range(len(self.targets))):
            try:
                return self._call(method, request)
            except AgentTxError as err:
                if left == 0 or err.code not in _core.UNKNOWN_OUTCOME_CODES:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        with self._lock:
            channels, self._channels, self._closed = list(self._channels.values()), {}, True
        for channel, _ in channels:
            channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transactions
    def begin(self, *, agent_id: str = "", metadata: Mapping[str, str] | None = None,
              policy: Policy | Mapping[str, Any] | None = None) -> Transaction:
        """Begin a transaction you end yourself with `commit()` or `rollback()`."""
        resp = self._call("BeginTransaction", _core.begin_request(agent_id, metadata, policy))
        return Transaction(self, resp.transaction_id, resp.next_step_id)

    def transaction(self, *, agent_id: str = "", metadata: Mapping[str, str] | None = None,
                    policy: Policy | Mapping[str, Any] | None = None) -> Transaction:
        """Begin a transaction for a `with` block: leaving it normally commits, leaving it
        by an exception aborts (and re-raises)."""
        return self.begin(agent_id=agent_id, metadata=metadata, policy=policy)

    def attach(self, transaction_id: str, *, next_step_id: int | None = None) -> Transaction:
        """A `Transaction` for an open transaction begun elsewhere (another process, an
        MCP session). Without `next_step_id` it is read from the service."""
        if next_step_id is not None:
            return Transaction(self, transaction_id, next_step_id, hints_seen=None)
        state = self.get(transaction_id)
        return Transaction(self, transaction_id, state.next_step_id,
                           hints_seen=len(state.constraints))

    def get(self, transaction_id: str) -> TransactionState:
        """GetTransaction. Retried with backoff while the service is UNAVAILABLE, then on
        the other replicas."""
        resp = self._read("GetTransaction", pb.GetTransactionRequest(transaction_id=transaction_id))
        return _core.transaction_state(resp)

    def rollback(self, transaction_id: str, to_step: int | None = None, *,
                 reason: str = "") -> RollbackResult:
        """RollbackTransaction for any open transaction (e.g. to resolve a MANUAL one).
        Not retried: a failed call may have undone some steps; call it again to resume."""
        resp = self._call("RollbackTransaction",
                          _core.rollback_request(transaction_id, to_step, reason))
        return _core.rollback_result(resp)

    def tools(self) -> list[ToolInfo]:
        """The tools this caller may use (ListTools): built-ins, plug-ins and the toolsets
        in scope, each with its description, input schema and kind."""
        resp = self._read("ListTools", pb.ListToolsRequest())
        return _core.tool_infos(resp)

    def list_page(self, *, page_size: int = 100, page_token: str = "",
                  status: TransactionStatus | str | None = None,
                  agent_id_prefix: str = "") -> TransactionPage:
        """One page of ListTransactions (open transactions, admin principals only once
        authentication is on)."""
        resp = self._read("ListTransactions",
                          _core.list_request(page_size, page_token, status, agent_id_prefix))
        return _core.transaction_page(resp)

    def list_transactions(self, *, status: TransactionStatus | str | None = None,
                          agent_id_prefix: str = "", page_size: int = 100
                          ) -> Iterator[TransactionSummary]:
        """Every open transaction, fetched a page at a time."""
        token = ""
        while True:
            page = self.list_page(page_size=page_size, page_token=token, status=status,
                                  agent_id_prefix=agent_id_prefix)
            yield from page.transactions
            token = page.next_page_token
            if not token:
                return

    # -- dead letters (admin principals once authentication is on)
    def dead_letters_page(self, *, page_size: int = 100,
                            page_token: str = "") -> DeadLetterPage:
        """One page of ListDeadLetters: effects their receivers refused for good."""
        resp = self._read("ListDeadLetters",
                          _core.dead_letters_request(page_size, page_token))
        return _core.dead_letter_page(resp)

    def dead_letters(self, *, page_size: int = 100) -> Iterator[DeadLetter]:
        """Every dead letter, fetched a page at a time."""
        token = ""
        while True:
            page = self.dead_letters_page(page_size=page_size, page_token=token)
            yield from page.dead_letters
            token = page.next_page_token
            if not token:
                return

    def retry_dead_letter(self, idempotency_key: str, *, principal: str = "",
                          reason: str = "") -> None:
        """RetryDeadLetter: back into the outbox with the same idempotency key; the
        dispatcher sends it within its poll interval. `principal` says whose letter when
        several principals have one with this key. Not retried on a lost answer: list
        the dead letters to see whether it applied."""
        self._call("RetryDeadLetter",
                   _core.dead_letter_request(idempotency_key, reason, principal))

    def discard_dead_letter(self, idempotency_key: str, reason: str, *,
                            principal: str = "") -> None:
        """DiscardDeadLetter: drop it for good; `reason` (required) goes into the
        service's audit log. The key stays reserved for the retention window."""
        self._call("DiscardDeadLetter",
                   _core.dead_letter_request(idempotency_key, reason, principal))


class Transaction:
    """An open transaction. It tracks the step id itself: `step()` sends the step the
    service asked for last (`next_step_id`), whatever happened before.

    Usable as a context manager (`Client.transaction()` returns one): leaving the block
    normally commits; leaving it by an exception aborts and re-raises; after an explicit
    `commit()` or abort (`rollback()` without `to_step`), or once the service ended the
    transaction (an ABORT strategy, a commit conflict), leaving does nothing more. A
    `rollback(to_step=k)` rewinds and keeps the transaction open, so the block still
    commits at its end.
    """

    def __init__(self, client: Client, transaction_id: str, next_step_id: int, *,
                 hints_seen: int | None = 0) -> None:
        self.client = client
        self._state = TxState(transaction_id, next_step_id, hints_seen)

    @property
    def id(self) -> str:
        return self._state.id

    @property
    def next_step_id(self) -> int:
        return self._state.next_step_id

    @property
    def finished(self) -> bool:
        """True once committed, aborted, or ended by the service."""
        return self._state.finished

    def __repr__(self) -> str:
        return f"<Transaction {self.id} next_step_id={self.next_step_id}>"

    def _fail(self, err: AgentTxError) -> AgentTxError:
        self._state.after_error(err)
        return err

    def _reread(self, rpc: str, cause: AgentTxError, step_id: int | None = None,
                resend_error: AgentTxError | None = None) -> OutcomeUnknown:
        try:
            reread: TransactionState | AgentTxError = self.client.get(self.id)
        except AgentTxError as err:
            reread = err
        return _core.reread_outcome(rpc, self.id, cause, reread, step_id=step_id,
                                    resend_error=resend_error)

    def _resend_lost(self, request: Any, step_id: int, cause: AgentTxError,
                     timeout: float | None) -> Any:
        """The answer to step `step_id` was lost: re-read, and send the step once more if
        the re-read proves it did not apply; otherwise raise `OutcomeUnknown`."""
        seen = self._reread("ExecuteStep", cause, step_id)
        if not (self.client.resend_lost_steps and seen.state is not None
                and _core.may_resend(seen.state, step_id, self._state.hints_seen)):
            raise self._fail(seen) from None
        self.client.resent_steps += 1
        log.info("re-sending step %d of transaction %s to %s after %s", step_id, self.id,
                 self.client.target, cause.code.name)
        try:
            return self.client._call("ExecuteStep", request, timeout)
        except AgentTxError as again:
            if again.code not in _core.UNKNOWN_OUTCOME_CODES | _core.MOVED_ON_CODES:
                raise self._fail(again) from None
            raise self._fail(self._reread("ExecuteStep", cause, step_id, again)) from None

    def step(self, tool: str, args: Mapping[str, Any] | str | None = None, *, context: str = "",
             timeout: float | None = None) -> StepResult:
        """Run one tool step. `args` is a JSON object (a dict, or a str already encoded);
        `context` is stored in the context log when the step succeeds. A failed step
        returns a StepResult with `ok` False; only RPC errors raise."""
        self._state.check_open()
        step_id = self._state.next_step_id
        request = _core.step_request(self.id, step_id, tool, args, context)
        try:
            resp = self.client._call("ExecuteStep", request, timeout)
        except AgentTxError as err:
            if err.code not in _core.UNKNOWN_OUTCOME_CODES:
                raise self._fail(err) from None
            resp = self._resend_lost(request, step_id, err, timeout)
        result = _core.step_result(resp, step_id, tool)
        self._state.after_step(result)
        return result

    def get(self) -> TransactionState:
        """GetTransaction (and refresh the tracked step id from it)."""
        try:
            state = self.client.get(self.id)
        except AgentTxError as err:
            raise self._fail(err) from None
        self._state.after_state(state)
        return state

    def commit(self, *, timeout: float | None = None) -> CommitResult:
        """Commit every live step atomically. Raises `Conflict` when another transaction
        committed a key this one read or wrote (this one is then undone and gone)."""
        try:
            resp = self.client._call("CommitTransaction",
                                     pb.CommitTransactionRequest(transaction_id=self.id), timeout)
        except AgentTxError as err:
            if err.code in _core.UNKNOWN_OUTCOME_CODES:
                err = self._reread("CommitTransaction", err)
            raise self._fail(err) from None
        self._state.finished = True
        return _core.commit_result(resp)

    def rollback(self, to_step: int | None = None, *, reason: str = "",
                 timeout: float | None = None) -> RollbackResult:
        """Without `to_step` (or 0): abort, undoing everything. With `to_step=k`: undo the
        live steps >= k and continue from step k."""
        try:
            resp = self.client._call("RollbackTransaction",
                                     _core.rollback_request(self.id, to_step, reason), timeout)
        except AgentTxError as err:
            if err.code in _core.UNKNOWN_OUTCOME_CODES:
                err = self._reread("RollbackTransaction", err)
            raise self._fail(err) from None
        result = _core.rollback_result(resp)
        self._state.after_rollback(result, to_step)
        return result

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._state.finished:
            return
        if exc_type is None:
            self.commit()
            return
        try:
            result = self.rollback(reason=TxState.abort_reason(exc_type))
        except NotFound:
            return  # already gone: nothing left to undo
        except AgentTxError as err:
            _core.note_failed_abort(exc, self.id, str(err))
            return
        if not result.rolled_back:
            _core.note_failed_abort(exc, self.id, "; ".join(result.compensation_errors))
