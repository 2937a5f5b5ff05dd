"""`AsyncClient` and `AsyncTransaction`: the asyncio front end (grpc.aio), with the same
surface and the same rules as the blocking one (`_sync`): never retry a commit or
rollback, re-send a lost step only when a re-read cleared it; leaving an `async with`
block by an exception aborts the transaction.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping, Sequence
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


class AsyncClient(_core.HasEndpoints):
    """The asyncio twin of `Client` (same arguments, same methods, awaited).

    >>> from agenttx.client import AsyncClient
    >>> async with AsyncClient("127.0.0.1:50051") as client:
    ...     async with client.transaction(agent_id="billing-agent") as tx:
    ...         r = await tx.step("kv.put", {"key": "invoice-7", "value": 42})
    ...         assert r.ok, r.hint

    The channel is opened on first use, inside the running event loop. `target` may be a
    list of replicas, and lost steps are re-sent, exactly as for `Client`.
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
        self._channels: dict[str, tuple[grpc.aio.Channel, pb_grpc.AgentTxServiceStub]] = {}

    def _get_stub(self) -> pb_grpc.AgentTxServiceStub:
        target = self.target
        if target not in self._channels:
            if self._tls is None:
                channel = grpc.aio.insecure_channel(target, options=self._options)
            else:
                channel = grpc.aio.secure_channel(target, self._tls.credentials(),
                                                  options=self._options)
            self._channels[target] = (channel, pb_grpc.AgentTxServiceStub(channel))
        return self._channels[target][1]

    async def _call(self, method: str, request: Any, timeout: float | None = None) -> Any:
        try:
            return await getattr(self._get_stub(), method)(
                request, timeout=self.timeout if timeout is None else timeout,
                metadata=self._metadata)
        except grpc.RpcError as rpc_error:
            err = from_rpc_error(rpc_error)
        self._endpoints.after_error(err.code)
        raise err

    async def _read(self, method: str, request: Any) -> Any:
        """A read: tried on each replica in turn while they do not answer."""
        for left in reversed(range(len(self.targets))):
            try:
                return await self._call(method, request)
            except AgentTxError as err:
                if left == 0 or err.code not in _core.UNKNOWN_OUTCOME_CODES:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}  # reopened on next use
        for channel, _ in channels:
            await channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- transactions
    async def begin(self, *, agent_id: str = "", metadata: Mapping[str, str] | None = None,
                    policy: Policy | Mapping[str, Any] | None = None) -> AsyncTransaction:
        """Begin a transaction you end yourself with `commit()` or `rollback()`."""
        resp = await self._call("BeginTransaction", _core.begin_request(agent_id, metadata, policy))
        return AsyncTransaction(self, resp.transaction_id, resp.next_step_id)

    def transaction(self, *, agent_id: str = "", metadata: Mapping[str, str] | None = None,
                    policy: Policy | Mapping[str, Any] | None = None) -> _AsyncTransactionBlock:
        """`async with client.transaction(...) as tx:` begins on entry; leaving the block
        normally commits, leaving it by an exception aborts (and re-raises)."""
        return _AsyncTransactionBlock(self, agent_id, metadata, policy)

    async def attach(self, transaction_id: str, *,
                     next_step_id: int | None = None) -> AsyncTransaction:
        """An `AsyncTransaction` for an open transaction begun elsewhere."""
        if next_step_id is not None:
            return AsyncTransaction(self, transaction_id, next_step_id, hints_seen=None)
        state = await self.get(transaction_id)
        return AsyncTransaction(self, transaction_id, state.next_step_id,
                                hints_seen=len(state.constraints))

    async def get(self, transaction_id: str) -> TransactionState:
        resp = await self._read("GetTransaction",
                                pb.GetTransactionRequest(transaction_id=transaction_id))
        return _core.transaction_state(resp)

    async def rollback(self, transaction_id: str, to_step: int | None = None, *,
                       reason: str = "") -> RollbackResult:
        resp = await self._call("RollbackTransaction",
                                _core.rollback_request(transaction_id, to_step, reason))
        return _core.rollback_result(resp)

    async def tools(self) -> list[ToolInfo]:
        """The tools this caller may use (ListTools): built-ins, plug-ins and the toolsets
        in scope, each with its description, input schema and kind."""
        resp = await self._read("ListTools", pb.ListToolsRequest())
        return _core.tool_infos(resp)

    async def list_page(self, *, page_size: int = 100, page_token: str = "",
                        status: TransactionStatus | str | None = None,
                        agent_id_prefix: str = "") -> TransactionPage:
        resp = await self._read("ListTransactions",
                                _core.list_request(page_size, page_token, status, agent_id_prefix))
        return _core.transaction_page(resp)

    async def list_transactions(self, *, status: TransactionStatus | str | None = None,
                                agent_id_prefix: str = "", page_size: int = 100
                                ) -> AsyncIterator[TransactionSummary]:
        token = ""
        while True:
            page = await self.list_page(page_size=page_size, page_token=token, status=status,
                                        agent_id_prefix=agent_id_prefix)
            for row in page.transactions:
                yield row
            token = page.next_page_token
            if not token:
                return

    # -- dead letters (admin principals once authentication is on)
    async def dead_letters_page(self, *, page_size: int = 100,
                                page_token: str = "") -> DeadLetterPage:
        """One page of ListDeadLetters: effects their receivers refused for good."""
        resp = await self._read("ListDeadLetters",
                                _core.dead_letters_request(page_size, page_token))
        return _core.dead_letter_page(resp)

    async def dead_letters(self, *, page_size: int = 100) -> AsyncIterator[DeadLetter]:
        """Every dead letter, fetched a page at a time."""
        token = ""
        while True:
            page = await self.dead_letters_page(page_size=page_size, page_token=token)
            for letter in page.dead_letters:
                yield letter
            token = page.next_page_token
            if not token:
                return

    async def retry_dead_letter(self, idempotency_key: str, *, principal: str = "",
                                reason: str = "") -> None:
        """RetryDeadLetter: back into the outbox with the same idempotency key; the
        dispatcher sends it within its poll interval. `principal` says whose letter when
        several principals have one with this key. Not retried on a lost answer: list
        the dead letters to see whether it applied."""
        await self._call("RetryDeadLetter",
                         _core.dead_letter_request(idempotency_key, reason, principal))

    async def discard_dead_letter(self, idempotency_key: str, reason: str, *,
                                  principal: str = "") -> None:
        """DiscardDeadLetter: drop it for good; `reason` (required) goes into the
        service's audit log. The key stays reserved for the retention window."""
        await self._call("DiscardDeadLetter",
                         _core.dead_letter_request(idempotency_key, reason, principal))


class _AsyncTransactionBlock:
    """What `AsyncClient.transaction()` returns: begins on `__aenter__`."""

    def __init__(self, client: AsyncClient, agent_id: str, metadata: Mapping[str, str] | None,
                 policy: Policy | Mapping[str, Any] | None) -> None:
        self._client, self._agent_id, self._metadata, self._policy = \
            client, agent_id, metadata, policy
        self._tx: AsyncTransaction | None = None

    async def __aenter__(self) -> AsyncTransaction:
        self._tx = await self._client.begin(agent_id=self._agent_id, metadata=self._metadata,
                                            policy=self._policy)
        return self._tx

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._tx is not None:
            await self._tx.__aexit__(exc_type, exc, tb)


class AsyncTransaction:
    """The asyncio twin of `Transaction` (same rules; see its docstring)."""

    def __init__(self, client: AsyncClient, transaction_id: str, next_step_id: int, *,
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
        return self._state.finished

    def __repr__(self) -> str:
        return f"<AsyncTransaction {self.id} next_step_id={self.next_step_id}>"

    def _fail(self, err: AgentTxError) -> AgentTxError:
        self._state.after_error(err)
        return err

    async def _reread(self, rpc: str, cause: AgentTxError, step_id: int | None = None,
                      resend_error: AgentTxError | None = None) -> OutcomeUnknown:
        try:
            reread: TransactionState | AgentTxError = await self.client.get(self.id)
        except AgentTxError as err:
            reread = err
        return _core.reread_outcome(rpc, self.id, cause, reread, step_id=step_id,
                                    resend_error=resend_error)

    async def _resend_lost(self, request: Any, step_id: int, cause: AgentTxError,
                           timeout: float | None) -> Any:
        """`Transaction._resend_lost`, awaited."""
        seen = await self._reread("ExecuteStep", cause, step_id)
        if not (self.client.resend_lost_steps and seen.state is not None
                and _core.may_resend(seen.state, step_id, self._state.hints_seen)):
            raise self._fail(seen) from None
        self.client.resent_steps += 1
        log.info("re-sending step %d of transaction %s to %s after %s", step_id, self.id,
                 self.client.target, cause.code.name)
        try:
            return await self.client._call("ExecuteStep", request, timeout)
        except AgentTxError as again:
            if again.code not in _core.UNKNOWN_OUTCOME_CODES | _core.MOVED_ON_CODES:
                raise self._fail(again) from None
            raise self._fail(await self._reread("ExecuteStep", cause, step_id, again)) from None

    async def step(self, tool: str, args: Mapping[str, Any] | str | None = None, *,
                   context: str = "", timeout: float | None = None) -> StepResult:
        self._state.check_open()
        step_id = self._state.next_step_id
        request = _core.step_request(self.id, step_id, tool, args, context)
        try:
            resp = await self.client._call("ExecuteStep", request, timeout)
        except AgentTxError as err:
            if err.code not in _core.UNKNOWN_OUTCOME_CODES:
                raise self._fail(err) from None
            resp = await self._resend_lost(request, step_id, err, timeout)
        result = _core.step_result(resp, step_id, tool)
        self._state.after_step(result)
        return result

    async def get(self) -> TransactionState:
        try:
            state = await self.client.get(self.id)
        except AgentTxError as err:
            raise self._fail(err) from None
        self._state.after_state(state)
        return state

    async def commit(self, *, timeout: float | None = None) -> CommitResult:
        try:
            resp = await self.client._call(
                "CommitTransaction", pb.CommitTransactionRequest(transaction_id=self.id), timeout)
        except AgentTxError as err:
            if err.code in _core.UNKNOWN_OUTCOME_CODES:
                err = await self._reread("CommitTransaction", err)
            raise self._fail(err) from None
        self._state.finished = True
        return _core.commit_result(resp)

    async def rollback(self, to_step: int | None = None, *, reason: str = "",
                       timeout: float | None = None) -> RollbackResult:
        try:
            resp = await self.client._call(
                "RollbackTransaction", _core.rollback_request(self.id, to_step, reason), timeout)
        except AgentTxError as err:
            if err.code in _core.UNKNOWN_OUTCOME_CODES:
                err = await self._reread("RollbackTransaction", err)
            raise self._fail(err) from None
        result = _core.rollback_result(resp)
        self._state.after_rollback(result, to_step)
        return result

    async def __aenter__(self) -> AsyncTransaction:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._state.finished:
            return
        if exc_type is None:
            await self.commit()
            return
        try:
            result = await self.rollback(reason=TxState.abort_reason(exc_type))
        except NotFound:
            return
        except AgentTxError as err:
            _core.note_failed_abort(exc, self.id, str(err))
            return
        if not result.rolled_back:
            _core.note_failed_abort(exc, self.id, "; ".join(result.compensation_errors))
