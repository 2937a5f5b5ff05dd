"""agenttx.v1.AgentTxService: validate -> call the engine -> convert.

Every method has the same four beats (as etcd's v3rpc server): check the request,
delegate, translate the error through api.status, fill the response. Errors are
translated in exactly one place (`_guard`), so no handler can answer UNKNOWN or leak a
traceback.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError

from agenttx.v1 import agenttx_pb2 as pb
from agenttx.v1 import agenttx_pb2_grpc as pb_grpc

from ..auth import Authenticator, RateLimiter
from ..effects.deadletters import DeadLetters
from ..engine.engine import Engine
from ..engine.model import ANONYMOUS, Caller
from ..errors import AgentTxError, FailedPrecondition, InvalidArgument
from ..observability import context as rpc_context
from ..observability import tracing
from ..observability.metrics import METRICS
from ..version import __version__
from . import convert, validation
from .status import status_for

log = logging.getLogger(__name__)

T = TypeVar("T")

SERVICE_NAME = "agenttx.v1.AgentTxService"
STATE_CHANGING = frozenset({"BeginTransaction", "ExecuteStep", "CommitTransaction",
                            "RollbackTransaction", "DecideApproval", "RetryDeadLetter",
                            "DiscardDeadLetter"})
_MESSAGES: dict[str, tuple[Any, Any]] = {
    "BeginTransaction": (pb.BeginTransactionRequest, pb.BeginTransactionResponse),
    "ExecuteStep": (pb.ExecuteStepRequest, pb.ExecuteStepResponse),
    "CommitTransaction": (pb.CommitTransactionRequest, pb.CommitTransactionResponse),
    "RollbackTransaction": (pb.RollbackTransactionRequest, pb.RollbackTransactionResponse),
    "GetTransaction": (pb.GetTransactionRequest, pb.GetTransactionResponse),
    "ListTransactions": (pb.ListTransactionsRequest, pb.ListTransactionsResponse),
    "GetTransactionHistory": (pb.GetTransactionHistoryRequest, pb.TransactionHistory),
    "ListTools": (pb.ListToolsRequest, pb.ListToolsResponse),
    "ListApprovals": (pb.ListApprovalsRequest, pb.ListApprovalsResponse),
    "DecideApproval": (pb.DecideApprovalRequest, pb.DecideApprovalResponse),
    "ListDeadLetters": (pb.ListDeadLettersRequest, pb.ListDeadLettersResponse),
    "RetryDeadLetter": (pb.DeadLetterRequest, pb.DeadLetterResponse),
    "DiscardDeadLetter": (pb.DeadLetterRequest, pb.DeadLetterResponse),
    "GetServiceStatus": (pb.GetServiceStatusRequest, pb.ServiceStatus),
}


class _Unparsable:
    """A request body that is not a valid message (bad UTF-8 in a string field, corrupt
    wire format). grpc would answer UNKNOWN for a deserializer that raises; handing this
    to the handler lets `_guard` answer INVALID_ARGUMENT instead."""

    def __init__(self, message_type: str, reason: str) -> None:
        self.message_type = message_type
        self.reason = reason


def _parser(message: Any) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return message.FromString(data)
        except DecodeError as exc:
            return _Unparsable(message.DESCRIPTOR.full_name, str(exc))
    return parse


def add_to_server(servicer: AgentTxServicer, server: grpc.aio.Server) -> None:
    """Register the service (as pb_grpc.add_AgentTxServiceServicer_to_server does), with
    deserializers that never raise, so a malformed request is INVALID_ARGUMENT, not UNKNOWN."""
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            getattr(servicer, name), request_deserializer=_parser(request),
            response_serializer=response.SerializeToString)
        for name, (request, response) in _MESSAGES.items()
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


def _guard(method: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Translate errors in one place and write the RPC's ONE log line and metrics."""
    name = method.__name__

    @functools.wraps(method)
    async def wrapper(self: AgentTxServicer, request: Any,
                      context: grpc.aio.ServicerContext) -> T:
        record = rpc_context.begin_rpc()
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        error = details = ""
        with tracing.rpc_span(name, context.invocation_metadata
                              if tracing.enabled() else None) as span:
            try:
                if isinstance(request, _Unparsable):
                    raise InvalidArgument(f"request is not a valid {request.message_type}: "
                                          f"{request.reason}")
                caller = await self.authenticate(context)
                record.fields["principal"] = caller.principal
                return await method(self, request, context, caller)
            except AgentTxError as exc:
                code, error = status_for(exc), str(exc)
                details = error
            except Exception:
                code, error = grpc.StatusCode.INTERNAL, "internal error"
                details = f"agenttx: internal error in {name}; see service logs"
                log.exception("internal error", extra={"rpc": name, **record.fields})
            finally:
                elapsed = time.perf_counter() - started
                tracing.set_rpc_status(span, code.name, code.value[0])
                METRICS.child(METRICS.rpc_duration, name, code.name).observe(elapsed)
                # `replica`: which process answered (`agenttx serve --workers N` shares one
                # port and one log stream between N replicas)
                fields = {"rpc": name, "code": code.name, "ms": round(elapsed * 1000, 2),
                          "etcd_round_trips": record.etcd_round_trips,
                          "replica": self.engine.replica_id, **record.fields}
                if name in STATE_CHANGING:
                    fields["audit"] = True  # docs/security.md#audit-log: who changed what, and how it ended
                if error:
                    fields["error"] = error
                log.info("rpc", extra=fields)
        await context.abort(code, details)
        raise AssertionError("unreachable")  # context.abort always raises

    return wrapper


class AgentTxServicer(pb_grpc.AgentTxServiceServicer):
    def __init__(self, engine: Engine, authenticator: Authenticator | None = None,
                 rate: RateLimiter | None = None, admins: frozenset[str] = frozenset(),
                 *, dead_letters: DeadLetters | None = None) -> None:
        self.engine = engine
        self.authenticator = authenticator
        self.rate = rate
        self.admins = admins
        self.dead_letters = dead_letters

    def _dead_letters(self) -> DeadLetters:
        if self.dead_letters is None:  # a servicer built without them (tests of other RPCs)
            raise FailedPrecondition("this replica serves no dead letters")
        return self.dead_letters

    async def authenticate(self, context: grpc.aio.ServicerContext) -> Caller:
        """Who is calling (docs/security.md#authentication---auth): UNAUTHENTICATED without
        valid credentials, then RESOURCE_EXHAUSTED past the principal's request rate."""
        if self.authenticator is None or self.authenticator.mode.value == "none":
            return ANONYMOUS
        principal = await self.authenticator.authenticate_call(context)
        if self.rate is not None:
            self.rate.check(principal)
        return Caller(principal=principal.name, namespace=principal.namespace,
                      admin=principal.is_admin or principal.name in self.admins,
                      authenticated=self.authenticator.mode.value != "none",
                      approver=principal.is_approver)

    @_guard
    async def BeginTransaction(self, request: pb.BeginTransactionRequest,  # noqa: N802
                               context: grpc.aio.ServicerContext,
                               caller: Caller) -> pb.BeginTransactionResponse:
        overrides = validation.begin(
            request.agent_id, dict(request.metadata),
            request.policy if request.HasField("policy") else None)
        tx_id, next_step = await self.engine.begin(request.agent_id, dict(request.metadata),
                                                   overrides, caller)
        return pb.BeginTransactionResponse(transaction_id=tx_id, next_step_id=next_step)

    @_guard
    async def ExecuteStep(self, request: pb.ExecuteStepRequest,  # noqa: N802
                          context: grpc.aio.ServicerContext,
                          caller: Caller) -> pb.ExecuteStepResponse:
        tx_id = validation.transaction_id(request.transaction_id)
        validation.step(request.step_id, request.tool_name, request.arguments_json,
                        request.raw_context)
        tx_id = validation.known_transaction_id(tx_id)
        outcome = await self.engine.execute(tx_id, request.step_id, request.tool_name,
                                            request.arguments_json, request.raw_context, caller)
        return convert.step_response(outcome)

    @_guard
    async def CommitTransaction(self, request: pb.CommitTransactionRequest,  # noqa: N802
                                context: grpc.aio.ServicerContext,
                                caller: Caller) -> pb.CommitTransactionResponse:
        tx_id = validation.known_transaction_id(validation.transaction_id(request.transaction_id))
        return convert.commit_response(await self.engine.commit(tx_id, caller))

    @_guard
    async def RollbackTransaction(self, request: pb.RollbackTransactionRequest,  # noqa: N802
                                  context: grpc.aio.ServicerContext,
                                  caller: Caller) -> pb.RollbackTransactionResponse:
        tx_id = validation.known_transaction_id(validation.transaction_id(request.transaction_id))
        to_step = request.to_step if request.HasField("to_step") else None
        outcome = await self.engine.rollback(tx_id, to_step, request.reason, caller)
        return convert.rollback_response(outcome)

    @_guard
    async def GetTransaction(self, request: pb.GetTransactionRequest,  # noqa: N802
                             context: grpc.aio.ServicerContext,
                             caller: Caller) -> pb.GetTransactionResponse:
        tx_id = validation.known_transaction_id(validation.transaction_id(request.transaction_id))
        return convert.transaction_response(await self.engine.get(tx_id, caller))

    @_guard
    async def ListTransactions(self, request: pb.ListTransactionsRequest,  # noqa: N802
                               context: grpc.aio.ServicerContext,
                               caller: Caller) -> pb.ListTransactionsResponse:
        page = await self.engine.list(
            caller, page_size=request.page_size,
            page_token=validation.page_token(request.page_token),
            status=convert.status_name(request.status),
            agent_id_prefix=request.agent_id_prefix)
        return convert.list_response(page)

    @_guard
    async def GetTransactionHistory(self, request: pb.GetTransactionHistoryRequest,  # noqa: N802
                                    context: grpc.aio.ServicerContext,
                                    caller: Caller) -> pb.TransactionHistory:
        tx_id = validation.known_transaction_id(validation.transaction_id(request.transaction_id))
        return convert.history_response(await self.engine.history(tx_id, caller))

    @_guard
    async def ListTools(self, request: pb.ListToolsRequest,  # noqa: N802
                        context: grpc.aio.ServicerContext,
                        caller: Caller) -> pb.ListToolsResponse:
        return convert.tools_response(await self.engine.list_tools(caller))

    # ---- approvals (approvers and admins; docs/approvals.md) ----------------------------

    @_guard
    async def ListApprovals(self, request: pb.ListApprovalsRequest,  # noqa: N802
                            context: grpc.aio.ServicerContext,
                            caller: Caller) -> pb.ListApprovalsResponse:
        page = await self.engine.list_approvals(
            caller, page_size=request.page_size,
            page_token=validation.page_token(request.page_token))
        return convert.approvals_response(page)

    @_guard
    async def DecideApproval(self, request: pb.DecideApprovalRequest,  # noqa: N802
                             context: grpc.aio.ServicerContext,
                             caller: Caller) -> pb.DecideApprovalResponse:
        tx_id = validation.transaction_id(request.transaction_id)
        validation.decision(request.digest, request.approve, request.reason)
        tx_id = validation.known_transaction_id(tx_id)
        # the audit line (docs/security.md#audit-log): who decided what, and how it ended (`outcome`)
        rpc_context.note(tx=tx_id, decision="approve" if request.approve else "reject",
                         reason=request.reason[:200])
        outcome = await self.engine.decide(tx_id, request.digest, request.approve,
                                           request.reason, caller)
        return convert.decision_response(outcome)

    @_guard
    async def GetServiceStatus(self, request: pb.GetServiceStatusRequest,  # noqa: N802
                               context: grpc.aio.ServicerContext,
                               caller: Caller) -> pb.ServiceStatus:
        counts = await self.engine.status()
        return convert.status_response(counts, self.engine.replica_id, __version__, caller)

    # ---- dead letters (admin only) ------------------------------------------------------

    @_guard
    async def ListDeadLetters(self, request: pb.ListDeadLettersRequest,  # noqa: N802
                              context: grpc.aio.ServicerContext,
                              caller: Caller) -> pb.ListDeadLettersResponse:
        validation.admin_only(caller, "ListDeadLetters")
        page = await self._dead_letters().list(request.page_size, request.page_token)
        rpc_context.note(listed=len(page.letters))
        return convert.dead_letters_response(page)

    @_guard
    async def RetryDeadLetter(self, request: pb.DeadLetterRequest,  # noqa: N802
                              context: grpc.aio.ServicerContext,
                              caller: Caller) -> pb.DeadLetterResponse:
        validation.admin_only(caller, "RetryDeadLetter")
        validation.dead_letter(request.idempotency_key, request.reason, reason_required=False)
        rpc_context.note(idempotency_key=request.idempotency_key, reason=request.reason)
        if request.principal:
            rpc_context.note(owner=request.principal)
        letter = await self._dead_letters().retry(request.idempotency_key, request.principal)
        rpc_context.note(tx=letter.entry.transaction_id, owner=letter.entry.owner,
                         channel=letter.entry.target, attempts=letter.entry.attempts)
        return pb.DeadLetterResponse()

    @_guard
    async def DiscardDeadLetter(self, request: pb.DeadLetterRequest,  # noqa: N802
                                context: grpc.aio.ServicerContext,
                                caller: Caller) -> pb.DeadLetterResponse:
        validation.admin_only(caller, "DiscardDeadLetter")
        validation.dead_letter(request.idempotency_key, request.reason, reason_required=True)
        rpc_context.note(idempotency_key=request.idempotency_key, reason=request.reason)
        if request.principal:
            rpc_context.note(owner=request.principal)
        letter = await self._dead_letters().discard(request.idempotency_key,
                                                    request.principal)
        if letter is not None:
            rpc_context.note(tx=letter.entry.transaction_id, owner=letter.entry.owner,
                             channel=letter.entry.target, attempts=letter.entry.attempts)
        return pb.DeadLetterResponse()
