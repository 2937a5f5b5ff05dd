"""`Client` and `Transaction`: the blocking front end (grpcio's sync channel).

Must never retry a step, a commit or a rollback (see `_core`), and must never leave a
transaction open by accident: leaving a `with` block by an exception aborts it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any

import grpc

from .._proto import agenttx_pb2 as pb
from .._proto import agenttx_pb2_grpc as pb_grpc
from . import _core
from ._core import TLS, TxState
from .errors import AgentTxError, NotFound, from_rpc_error
from .types import (
    CommitResult,
    Policy,
    RollbackResult,
    StepResult,
    TransactionPage,
    TransactionState,
    TransactionStatus,
    TransactionSummary,
)


class Client:
    """A connection to an AgentTx service.

    >>> from agenttx.client import Client
    >>> with Client("127.0.0.1:50051") as client:
    ...     with client.transaction(agent_id="billing-agent") as tx:
    ...         tx.step("kv.put", {"key": "invoice-7", "value": {"total": 42}})
    ...         r = tx.step("kv.get", {"key": "customer-9"})
    ...         if not r.ok:
    ...             print(r.category, r.hint, r.strategy, r.next_step_id)
    ...     # leaving the block committed the transaction

    `target` is `host:port`. Without `tls` the channel is plaintext; `tls=True` verifies the
    server against the system roots, `tls=TLS(ca=..., cert=..., key=...)` against a private
    CA and with a client certificate (mTLS). `token` is sent as `authorization: Bearer
    <token>` on every call. `timeout` (seconds) bounds each call.
    """

    def __init__(self, target: str = _core.DEFAULT_TARGET, *, token: str | None = None,
                 tls: bool | TLS | None = None, timeout: float | None = _core.DEFAULT_TIMEOUT_S,
                 options: list[tuple[str, Any]] | None = None) -> None:
        self.target = target
        self.timeout = timeout
        self._tls = _core.resolve_tls(tls)
        self._metadata = _core.call_metadata(token)
        opts = _core.channel_options(self._tls, options or ())
        if self._tls is None:
            self._channel = grpc.insecure_channel(target, options=opts)
        else:
            self._channel = grpc.secure_channel(target, self._tls.credentials(), options=opts)
        self._stub = pb_grpc.AgentTxServiceStub(self._channel)

    # -- plumbing
    def _call(self, method: str, request: Any, timeout: float | None = None) -> Any:
        try:
            return getattr(self._stub, method)(
                request, timeout=self.timeout if timeout is None else timeout,
                metadata=self._metadata)
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    def close(self) -> None:
        self._channel.close()

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
        if next_step_id is None:
            next_step_id = self.get(transaction_id).next_step_id
        return Transaction(self, transaction_id, next_step_id)

    def get(self, transaction_id: str) -> TransactionState:
        """GetTransaction. Retried with backoff while the service is UNAVAILABLE."""
        resp = self._call("GetTransaction", pb.GetTransactionRequest(transaction_id=transaction_id))
        return _core.transaction_state(resp)

    def rollback(self, transaction_id: str, to_step: int | None = None, *,
                 reason: str = "") -> RollbackResult:
        """RollbackTransaction for any open transaction (e.g. to resolve a MANUAL one).
        Not retried: a failed call may have undone some steps; call it again to resume."""
        resp = self._call("RollbackTransaction",
                          _core.rollback_request(transaction_id, to_step, reason))
        return _core.rollback_result(resp)

    def list_page(self, *, page_size: int = 100, page_token: str = "",
                  status: TransactionStatus | str | None = None,
                  agent_id_prefix: str = "") -> TransactionPage:
        """One page of ListTransactions (open transactions, admin principals only once
        authentication is on)."""
        resp = self._call("ListTransactions",
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

    def __init__(self, client: Client, transaction_id: str, next_step_id: int) -> None:
        self.client = client
        self._state = TxState(transaction_id, next_step_id)

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

    def _reread(self, rpc: str, cause: AgentTxError, step_id: int | None = None) -> AgentTxError:
        try:
            state = self.client.get(self.id)
        except NotFound:
            return _core.unknown_outcome(rpc, self.id, cause, step_id=step_id, ended=True)
        except AgentTxError as err:
            return _core.unknown_outcome(rpc, self.id, cause, step_id=step_id, reread_error=err)
        return _core.unknown_outcome(rpc, self.id, cause, step_id=step_id, state=state)

    def step(self, tool: str, args: Mapping[str, Any] | str | None = None, *, context: str = "",
             timeout: float | None = None) -> StepResult:
        """Run one tool step. `args` is a JSON object (a dict, or a str already encoded);
        `context` is stored in the context log when the step succeeds. A failed step
        returns a StepResult with `ok` False; only RPC errors raise."""
        self._state.check_open()
        step_id = self._state.next_step_id
        try:
            resp = self.client._call("ExecuteStep",
                                     _core.step_request(self.id, step_id, tool, args, context),
                                     timeout)
        except AgentTxError as err:
            if err.code in _core.UNKNOWN_OUTCOME_CODES:
                err = self._reread("ExecuteStep", err, step_id)
            raise self._fail(err) from None
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
