"""`AsyncClient` and `AsyncTransaction`: the asyncio front end (grpc.aio).

The same surface and the same rules as the blocking one (`_sync`), because the rules
are not here: they live once, in `_flows`; this module only opens channels (inside the
running event loop, on first use) and awaits a flow's calls (`AsyncClient._drive`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar, cast

import grpc

from ..v1 import agenttx_pb2_grpc as pb_grpc
from . import _core, _flows
from ._core import TLS
from ._flows import Flow, Sleep
from .errors import AgentTxError, from_rpc_error
from .types import (
    Approval,
    ApprovalPage,
    CommitResult,
    DeadLetter,
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
    TransactionSummary,
)

T = TypeVar("T")

CLOSED = "this agenttx AsyncClient is closed"


class AsyncClient(_core.HasEndpoints):
    """The asyncio twin of `Client` (same arguments, same methods, awaited).

    >>> from agenttx.client import AsyncClient
    >>> async with AsyncClient("127.0.0.1:50051") as client:
    ...     async with client.transaction(agent_id="billing-agent") as tx:
    ...         r = await tx.step("kv.put", {"key": "invoice-7", "value": 42})

    The channel is opened on first use, inside the running event loop. `target` may be a
    list of replicas, lost steps are re-sent, and after `close()` every call raises
    ValueError, exactly as for `Client`.
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
        self._lock = threading.Lock()
        self._closed = False

    # -- plumbing
    def _stub(self) -> pb_grpc.AgentTxServiceStub:
        target = self.target
        opened = self._channels.get(target)
        if opened is not None:
            return opened[1]
        with self._lock:
            if self._closed:
                raise ValueError(CLOSED)
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
            return await getattr(self._stub(), method)(
                request, timeout=self.timeout if timeout is None else timeout,
                metadata=self._metadata)
        except grpc.RpcError as rpc_error:
            err = from_rpc_error(rpc_error)
        self._endpoints.after_error(err.code)
        raise err

    async def _drive(self, flow: Flow[T]) -> T:
        """`Client._drive`, awaited."""
        try:
            call = next(flow)
            while True:
                if isinstance(call, Sleep):
                    await asyncio.sleep(call.seconds)
                    call = flow.send(None)
                    continue
                try:
                    answer = await self._call(call.method, call.request, call.timeout)
                except AgentTxError as err:
                    call = flow.throw(err)
                else:
                    call = flow.send(answer)
        except StopIteration as done:
            return cast(T, done.value)

    async def close(self) -> None:
        with self._lock:
            channels, self._channels, self._closed = list(self._channels.values()), {}, True
        for channel, _ in channels:
            await channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- transactions
    async def begin(self, *, agent_id: str = "", metadata: Mapping[str, str] | None = None,
                    policy: Policy | Mapping[str, Any] | None = None,
                    strict: bool = False) -> AsyncTransaction:
        """Begin a transaction you end yourself with `commit()` or `rollback()`."""
        tx_id, next_step = await self._drive(_flows.begin(agent_id, metadata, policy))
        return AsyncTransaction(self, tx_id, next_step, strict=strict)

    def transaction(self, *, agent_id: str = "", metadata: Mapping[str, str] | None = None,
                    policy: Policy | Mapping[str, Any] | None = None,
                    strict: bool = False) -> _AsyncTransactionBlock:
        """`async with client.transaction(...) as tx:` begins on entry; leaving the block
        does what leaving `Client.transaction()`'s does (see `Transaction`)."""
        return _AsyncTransactionBlock(self, agent_id, metadata, policy, strict)

    async def attach(self, transaction_id: str, *, next_step_id: int | None = None,
                     strict: bool = False) -> AsyncTransaction:
        """An `AsyncTransaction` for an open transaction begun elsewhere."""
        _flows.attach_state(transaction_id, next_step_id)
        if next_step_id is not None:
            return AsyncTransaction(self, transaction_id, next_step_id, hints_seen=None,
                                    strict=strict)
        state = await self.get(transaction_id)
        return AsyncTransaction(self, transaction_id, state.next_step_id,
                                hints_seen=len(state.constraints), strict=strict)

    async def get(self, transaction_id: str) -> TransactionState:
        return await self._drive(_flows.get(transaction_id, len(self.targets)))

    async def history(self, transaction_id: str) -> TransactionHistory:
        return await self._drive(_flows.history(transaction_id, len(self.targets)))

    async def rollback(self, transaction_id: str, to_step: int | None = None, *,
                       reason: str = "") -> RollbackResult:
        return await self._drive(_flows.rollback(transaction_id, to_step, reason))

    async def tools(self) -> list[ToolInfo]:
        return await self._drive(_flows.tools(len(self.targets)))

    async def list_page(self, *, page_size: int = 100, page_token: str = "",
                        status: TransactionStatus | str | None = None,
                        agent_id_prefix: str = "") -> TransactionPage:
        return await self._drive(_flows.list_page(page_size, page_token, status,
                                                  agent_id_prefix, len(self.targets)))

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

    # -- approvals (approvers and admins once authentication is on; docs/approvals.md)
    async def approvals_page(self, *, page_size: int = 100,
                             page_token: str = "") -> ApprovalPage:
        """One page of ListApprovals (see `Client.approvals_page`)."""
        return await self._drive(_flows.approvals_page(page_size, page_token,
                                                       len(self.targets)))

    async def approvals(self, *, page_size: int = 100) -> AsyncIterator[Approval]:
        """Every pending approval this caller may decide, fetched a page at a time."""
        token = ""
        while True:
            page = await self.approvals_page(page_size=page_size, page_token=token)
            for approval in page.approvals:
                yield approval
            token = page.next_page_token
            if not token:
                return

    async def approve(self, transaction_id: str, digest: str, *,
                      reason: str = "") -> Decision:
        """DecideApproval(approve) (see `Client.approve`)."""
        return await self._drive(_flows.decide(transaction_id, digest, True, reason))

    async def reject(self, transaction_id: str, reason: str) -> Decision:
        """DecideApproval(reject) (see `Client.reject`)."""
        return await self._drive(_flows.decide(transaction_id, "", False, reason))

    # -- dead letters (admin principals once authentication is on)
    async def dead_letters_page(self, *, page_size: int = 100,
                                page_token: str = "") -> DeadLetterPage:
        """One page of ListDeadLetters: effects their receivers refused for good."""
        return await self._drive(_flows.dead_letters_page(page_size, page_token,
                                                      len(self.targets)))

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
        await self._drive(_flows.dead_letter_action("RetryDeadLetter", idempotency_key, reason,
                                                   principal))

    async def discard_dead_letter(self, idempotency_key: str, reason: str, *,
                                  principal: str = "") -> None:
        """DiscardDeadLetter: drop it for good; `reason` (required) goes into the
        service's audit log. The key stays reserved for the retention window."""
        await self._drive(_flows.dead_letter_action("DiscardDeadLetter", idempotency_key, reason,
                                                   principal))

    # -- status
    async def status(self) -> ServiceStatus:
        """GetServiceStatus: etcd reachability, open transactions, outbox depth, dead
        letters (the deployment's counts), and who the service takes this caller for."""
        return await self._drive(_flows.status(len(self.targets)))


class _AsyncTransactionBlock:
    """What `AsyncClient.transaction()` returns: begins on `__aenter__`."""

    def __init__(self, client: AsyncClient, agent_id: str, metadata: Mapping[str, str] | None,
                 policy: Policy | Mapping[str, Any] | None, strict: bool) -> None:
        self._client, self._agent_id, self._metadata, self._policy = \
            client, agent_id, metadata, policy
        self._strict = strict
        self._tx: AsyncTransaction | None = None

    async def __aenter__(self) -> AsyncTransaction:
        self._tx = await self._client.begin(agent_id=self._agent_id, metadata=self._metadata,
                                            policy=self._policy, strict=self._strict)
        return self._tx

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._tx is not None:
            await self._tx.__aexit__(exc_type, exc, tb)


class AsyncTransaction:
    """The asyncio twin of `Transaction` (same rules; see its docstring)."""

    def __init__(self, client: AsyncClient, transaction_id: str, next_step_id: int, *,
                 hints_seen: int | None = 0, strict: bool = False) -> None:
        self.client = client
        self._core = _flows.TxCore(client, transaction_id, next_step_id,
                                   hints_seen=hints_seen, strict=strict)

    @property
    def id(self) -> str:
        return self._core.id

    @property
    def next_step_id(self) -> int:
        return self._core.next_step_id

    @property
    def strict(self) -> bool:
        return self._core.strict

    @property
    def finished(self) -> bool:
        return self._core.finished

    def __repr__(self) -> str:
        return f"<AsyncTransaction {self.id} next_step_id={self.next_step_id}>"

    async def step(self, tool: str, args: Mapping[str, Any] | str | None = None, *,
                   context: str = "", timeout: float | None = None) -> StepResult:
        return await self.client._drive(self._core.step(tool, args, context, timeout))

    async def get(self) -> TransactionState:
        return await self.client._drive(self._core.get())

    async def history(self) -> TransactionHistory:
        return await self.client._drive(self._core.history())

    async def commit(self, *, timeout: float | None = None,
                     wait_for_approval: float | None = None) -> CommitResult:
        """See `Transaction.commit` (the wait sleeps in the event loop)."""
        return await self.client._drive(self._core.commit(timeout, wait_for_approval))

    async def rollback(self, to_step: int | None = None, *, reason: str = "",
                       timeout: float | None = None) -> RollbackResult:
        return await self.client._drive(self._core.rollback(to_step, reason, timeout))

    async def __aenter__(self) -> AsyncTransaction:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.client._drive(self._core.exit(exc_type, exc))
