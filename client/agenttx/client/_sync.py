"""`Client` and `Transaction`: the blocking front end (grpcio's sync channel).

Why so thin: every rule (what is retried, what a lost answer means, what leaving a
`with` block does) lives once, in `_flows`, shared with the asyncio client; this module
only opens channels and runs a flow's calls one after the other (`Client._drive`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
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

CLOSED = "this agenttx Client is closed"


class Client(_core.HasEndpoints):
    """A connection to an AgentTx service.

    >>> from agenttx.client import Client
    >>> with Client("127.0.0.1:50051") as client:
    ...     with client.transaction(agent_id="billing-agent") as tx:
    ...         tx.step("kv.put", {"key": "invoice-7", "value": {"total": 42}})
    ...         tx.step("kv.put", {"key": "invoice-7-status", "value": "open"})
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
    those re-sends. Commits and rollbacks are never retried. After `close()` every call
    raises ValueError.
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
                raise ValueError(CLOSED)
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

    def _drive(self, flow: Flow[T]) -> T:
        """Run a flow (`_flows`): send each call it yields, hand back the answer or
        throw the error in, until it returns."""
        try:
            call = next(flow)
            while True:
                if isinstance(call, Sleep):
                    time.sleep(call.seconds)
                    call = flow.send(None)
                    continue
                try:
                    answer = self._call(call.method, call.request, call.timeout)
                except AgentTxError as err:
                    call = flow.throw(err)
                else:
                    call = flow.send(answer)
        except StopIteration as done:
            return cast(T, done.value)

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
              policy: Policy | Mapping[str, Any] | None = None,
              strict: bool = False) -> Transaction:
        """Begin a transaction you end yourself with `commit()` or `rollback()`."""
        tx_id, next_step = self._drive(_flows.begin(agent_id, metadata, policy))
        return Transaction(self, tx_id, next_step, strict=strict)

    def transaction(self, *, agent_id: str = "", metadata: Mapping[str, str] | None = None,
                    policy: Policy | Mapping[str, Any] | None = None,
                    strict: bool = False) -> Transaction:
        """Begin a transaction for a `with` block (see `Transaction` for what leaving it
        does). With `strict=True` a failed step raises `StepFailed` at once."""
        return self.begin(agent_id=agent_id, metadata=metadata, policy=policy, strict=strict)

    def attach(self, transaction_id: str, *, next_step_id: int | None = None,
               strict: bool = False) -> Transaction:
        """A `Transaction` for an open transaction begun elsewhere (another process, an
        MCP session). Without `next_step_id` it is read from the service."""
        _flows.attach_state(transaction_id, next_step_id)
        if next_step_id is not None:
            return Transaction(self, transaction_id, next_step_id, hints_seen=None,
                               strict=strict)
        state = self.get(transaction_id)
        return Transaction(self, transaction_id, state.next_step_id,
                           hints_seen=len(state.constraints), strict=strict)

    def get(self, transaction_id: str) -> TransactionState:
        """GetTransaction (open transactions only; ended ones answer NOT_FOUND). Retried
        with backoff while the service is UNAVAILABLE, then on the other replicas."""
        return self._drive(_flows.get(transaction_id, len(self.targets)))

    def history(self, transaction_id: str) -> TransactionHistory:
        """GetTransactionHistory: an open or ended transaction's record (status, who ended
        it and why, every step sent). Owner or admin; NOT_FOUND otherwise, and once the
        service's history retention has passed."""
        return self._drive(_flows.history(transaction_id, len(self.targets)))

    def rollback(self, transaction_id: str, to_step: int | None = None, *,
                 reason: str = "") -> RollbackResult:
        """RollbackTransaction for any open transaction (e.g. to resolve a MANUAL one).
        Not retried: a failed call may have undone some steps; call it again to resume."""
        return self._drive(_flows.rollback(transaction_id, to_step, reason))

    def tools(self) -> list[ToolInfo]:
        """The tools this caller may use (ListTools): built-ins, plug-ins and the toolsets
        in scope, each with its description, input schema and kind."""
        return self._drive(_flows.tools(len(self.targets)))

    def list_page(self, *, page_size: int = 100, page_token: str = "",
                  status: TransactionStatus | str | None = None,
                  agent_id_prefix: str = "") -> TransactionPage:
        """One page of ListTransactions: open transactions, every principal's for an
        admin, the caller's own otherwise."""
        return self._drive(_flows.list_page(page_size, page_token, status, agent_id_prefix,
                                            len(self.targets)))

    def list_transactions(self, *, status: TransactionStatus | str | None = None,
                          agent_id_prefix: str = "", page_size: int = 100
                          ) -> Iterator[TransactionSummary]:
        """Every open transaction the caller may see, fetched a page at a time."""
        token = ""
        while True:
            page = self.list_page(page_size=page_size, page_token=token, status=status,
                                  agent_id_prefix=agent_id_prefix)
            yield from page.transactions
            token = page.next_page_token
            if not token:
                return

    # -- approvals (approvers and admins once authentication is on; docs/approvals.md)
    def approvals_page(self, *, page_size: int = 100, page_token: str = "") -> ApprovalPage:
        """One page of ListApprovals: transactions awaiting a person's approval that
        this caller may decide."""
        return self._drive(_flows.approvals_page(page_size, page_token, len(self.targets)))

    def approvals(self, *, page_size: int = 100) -> Iterator[Approval]:
        """Every pending approval this caller may decide, fetched a page at a time."""
        token = ""
        while True:
            page = self.approvals_page(page_size=page_size, page_token=token)
            yield from page.approvals
            token = page.next_page_token
            if not token:
                return

    def approve(self, transaction_id: str, digest: str, *, reason: str = "") -> Decision:
        """DecideApproval(approve): commit the transaction now, if `digest` is the one
        pending (what `approvals()` showed); `FailedPrecondition` otherwise, and nothing
        changes. The principal that began it may not (`PermissionDenied`). The result's
        `status` is COMMITTED, or ABORTED when another transaction committed a key it
        read or wrote meanwhile (then it was compensated). Never retried."""
        return self._drive(_flows.decide(transaction_id, digest, True, reason))

    def reject(self, transaction_id: str, reason: str) -> Decision:
        """DecideApproval(reject): undo everything the transaction did and end it as
        REJECTED with `reason` (required; its history and the audit log keep it). No
        digest: rejecting is always safe. Never retried."""
        return self._drive(_flows.decide(transaction_id, "", False, reason))

    # -- dead letters (admin principals once authentication is on)
    def dead_letters_page(self, *, page_size: int = 100,
                            page_token: str = "") -> DeadLetterPage:
        """One page of ListDeadLetters: effects their receivers refused for good."""
        return self._drive(_flows.dead_letters_page(page_size, page_token,
                                                      len(self.targets)))

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
        self._drive(_flows.dead_letter_action("RetryDeadLetter", idempotency_key, reason,
                                                   principal))

    def discard_dead_letter(self, idempotency_key: str, reason: str, *,
                            principal: str = "") -> None:
        """DiscardDeadLetter: drop it for good; `reason` (required) goes into the
        service's audit log. The key stays reserved for the retention window."""
        self._drive(_flows.dead_letter_action("DiscardDeadLetter", idempotency_key, reason,
                                                   principal))

    # -- status
    def status(self) -> ServiceStatus:
        """GetServiceStatus: etcd reachability, open transactions, outbox depth, dead
        letters (the deployment's counts), and who the service takes this caller for."""
        return self._drive(_flows.status(len(self.targets)))


class Transaction:
    """An open transaction. It tracks the step id itself: `step()` sends the step the
    service asked for last (`next_step_id`), whatever happened before.

    As a context manager (`Client.transaction()` returns one), leaving the block:
    - after an explicit `commit()` or abort (`rollback()` without `to_step`): nothing more;
    - by an exception: aborts (undoing everything) and re-raises;
    - normally, when the service ended the transaction (an ABORT strategy, the idle
      reaper, an admin's rollback): raises `TransactionEnded` with its history;
    - normally, when a step answer in the block failed: rolls back and raises
      `StepFailed` (the first failure): code that recovered says so with `commit()`;
    - otherwise: commits (a lost race raises `Conflict`).
    A `rollback(to_step=k)` rewinds and keeps the transaction open.
    """

    def __init__(self, client: Client, transaction_id: str, next_step_id: int, *,
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
        """True once committed or aborted here, or ended by the service."""
        return self._core.finished

    def __repr__(self) -> str:
        return f"<Transaction {self.id} next_step_id={self.next_step_id}>"

    def step(self, tool: str, args: Mapping[str, Any] | str | None = None, *, context: str = "",
             timeout: float | None = None) -> StepResult:
        """Run one tool step. `args` is a JSON object (a dict, or a str already encoded);
        `context` is stored in the context log when the step succeeds. A failed step
        returns a StepResult with `ok` False (raises `StepFailed` when strict); RPC
        errors raise."""
        return self.client._drive(self._core.step(tool, args, context, timeout))

    def get(self) -> TransactionState:
        """GetTransaction (and refresh the tracked step id from it)."""
        return self.client._drive(self._core.get())

    def history(self) -> TransactionHistory:
        """GetTransactionHistory of this transaction, open or ended."""
        return self.client._drive(self._core.history())

    def commit(self, *, timeout: float | None = None,
               wait_for_approval: float | None = None) -> CommitResult:
        """Commit every live step atomically. Raises `Conflict` when another transaction
        committed a key this one read or wrote (this one is then undone and gone), and
        `TransactionEnded` when the service had already ended it.

        When steps need a person's approval the result says `awaiting_approval` (nothing
        committed yet); with `wait_for_approval=SECONDS` this waits up to that long for
        the decision and returns it (`status` COMMITTED, REJECTED or ABORTED; see
        `CommitResult`)."""
        return self.client._drive(self._core.commit(timeout, wait_for_approval))

    def rollback(self, to_step: int | None = None, *, reason: str = "",
                 timeout: float | None = None) -> RollbackResult:
        """Without `to_step` (or 0): abort, undoing everything. With `to_step=k` (>= 1):
        undo the live steps >= k and continue from step k."""
        return self.client._drive(self._core.rollback(to_step, reason, timeout))

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.client._drive(self._core.exit(exc_type, exc))
