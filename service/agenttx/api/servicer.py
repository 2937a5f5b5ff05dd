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

from .._proto import agenttx_pb2 as pb
from .._proto import agenttx_pb2_grpc as pb_grpc
from ..engine.transactions import Engine
from ..errors import AgentTxError, InvalidArgument
from ..store.client import ROUND_TRIPS
from . import convert, validation
from .status import status_for

log = logging.getLogger(__name__)

T = TypeVar("T")

SERVICE_NAME = "agenttx.v1.AgentTxService"
_MESSAGES: dict[str, tuple[Any, Any]] = {
    "BeginTransaction": (pb.BeginTransactionRequest, pb.BeginTransactionResponse),
    "ExecuteStep": (pb.ExecuteStepRequest, pb.ExecuteStepResponse),
    "CommitTransaction": (pb.CommitTransactionRequest, pb.CommitTransactionResponse),
    "RollbackTransaction": (pb.RollbackTransactionRequest, pb.RollbackTransactionResponse),
    "GetTransaction": (pb.GetTransactionRequest, pb.GetTransactionResponse),
    "ListTransactions": (pb.ListTransactionsRequest, pb.ListTransactionsResponse),
}
# ListTransactions page sizes (proto: default 100, at most 1000; larger asks are capped).
LIST_DEFAULT_PAGE = 100
LIST_MAX_PAGE = 1000
_LIST_STATUS = {
    pb.TRANSACTION_STATUS_UNSPECIFIED: None,
    pb.TRANSACTION_STATUS_ACTIVE: "ACTIVE",
    pb.TRANSACTION_STATUS_AWAITING_ROLLBACK: "AWAITING_ROLLBACK",
}
_ENDED_STATUSES = (pb.TRANSACTION_STATUS_COMMITTED, pb.TRANSACTION_STATUS_ABORTED,
                   pb.TRANSACTION_STATUS_EXPIRED)


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
    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> T:
        trips = [0]
        ROUND_TRIPS.set(trips)  # each RPC runs in its own task: a fresh context
        started = time.perf_counter()
        try:
            if isinstance(request, _Unparsable):
                raise InvalidArgument(f"request is not a valid {request.message_type}: "
                                      f"{request.reason}")
            response = await method(self, request, context)
            log.info("rpc", extra={"rpc": method.__name__, "code": "OK",
                                   "ms": round((time.perf_counter() - started) * 1000, 2),
                                   "etcd_round_trips": trips[0]})
            return response
        except AgentTxError as exc:
            code = status_for(exc)
            log.info("rpc refused", extra={"rpc": method.__name__, "code": code.name,
                                           "error": str(exc)})
            await context.abort(code, str(exc))
        except Exception:
            log.exception("internal error", extra={"rpc": method.__name__})
            await context.abort(grpc.StatusCode.INTERNAL,
                                f"agenttx: internal error in {method.__name__}; see service logs")
        raise AssertionError("unreachable")  # context.abort always raises

    return wrapper


class AgentTxServicer(pb_grpc.AgentTxServiceServicer):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @_guard
    async def BeginTransaction(self, request: pb.BeginTransactionRequest,  # noqa: N802
                               context: grpc.aio.ServicerContext) -> pb.BeginTransactionResponse:
        overrides = validation.begin(
            request.agent_id, dict(request.metadata),
            request.policy if request.HasField("policy") else None)
        tx_id, next_step = await self.engine.begin(request.agent_id, dict(request.metadata),
                                                   overrides)
        return pb.BeginTransactionResponse(transaction_id=tx_id, next_step_id=next_step)

    @_guard
    async def ExecuteStep(self, request: pb.ExecuteStepRequest,  # noqa: N802
                          context: grpc.aio.ServicerContext) -> pb.ExecuteStepResponse:
        tx_id = validation.transaction_id(request.transaction_id)
        validation.step(request.step_id, request.tool_name, request.arguments_json,
                        request.raw_context)
        tx_id = validation.known_transaction_id(tx_id)
        outcome = await self.engine.execute(tx_id, request.step_id, request.tool_name,
                                            request.arguments_json, request.raw_context)
        return convert.step_response(outcome)

    @_guard
    async def CommitTransaction(self, request: pb.CommitTransactionRequest,  # noqa: N802
                                context: grpc.aio.ServicerContext) -> pb.CommitTransactionResponse:
        tx_id = validation.known_transaction_id(validation.transaction_id(request.transaction_id))
        return convert.commit_response(await self.engine.commit(tx_id))

    @_guard
    async def RollbackTransaction(self, request: pb.RollbackTransactionRequest,  # noqa: N802
                                  context: grpc.aio.ServicerContext
                                  ) -> pb.RollbackTransactionResponse:
        tx_id = validation.known_transaction_id(validation.transaction_id(request.transaction_id))
        to_step = request.to_step if request.HasField("to_step") else None
        outcome = await self.engine.rollback(tx_id, to_step, request.reason)
        return convert.rollback_response(outcome)

    @_guard
    async def GetTransaction(self, request: pb.GetTransactionRequest,  # noqa: N802
                             context: grpc.aio.ServicerContext) -> pb.GetTransactionResponse:
        tx_id = validation.known_transaction_id(validation.transaction_id(request.transaction_id))
        return convert.transaction_response(await self.engine.get(tx_id))

    @_guard
    async def ListTransactions(self, request: pb.ListTransactionsRequest,  # noqa: N802
                               context: grpc.aio.ServicerContext) -> pb.ListTransactionsResponse:
        # Without authentication any caller may list; admin-only once §9 lands.
        if request.status in _ENDED_STATUSES:
            return pb.ListTransactionsResponse()  # ended transactions are never listed
        if request.status not in _LIST_STATUS:
            raise InvalidArgument(f"status {request.status} is not a TransactionStatus")
        if len(request.agent_id_prefix.encode()) > validation.MAX_AGENT_ID_BYTES:
            raise InvalidArgument(f"agent_id_prefix is longer than "
                                  f"{validation.MAX_AGENT_ID_BYTES} bytes")
        size = min(request.page_size or LIST_DEFAULT_PAGE, LIST_MAX_PAGE)
        rows, token = await self.engine.list_transactions(
            size, request.page_token, _LIST_STATUS[request.status], request.agent_id_prefix)
        return pb.ListTransactionsResponse(next_page_token=token, transactions=[
            pb.TransactionSummary(
                transaction_id=r.transaction_id,
                status=convert.TX_STATUS.get(r.status, pb.TRANSACTION_STATUS_UNSPECIFIED),
                agent_id=r.agent_id, principal=r.principal, next_step_id=r.next_step_id,
                created_at=r.created_at, updated_at=r.updated_at)
            for r in rows])
