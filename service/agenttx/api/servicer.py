"""agenttx.v1.AgentTxService: validate -> call the engine -> convert.

Every method has the same four beats (as etcd's v3rpc server): check the request,
delegate, translate the error through api.status, fill the response. Errors are
translated in exactly one place (`_guard`), so no handler can answer UNKNOWN or leak a
traceback.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from .._proto import agenttx_pb2 as pb
from .._proto import agenttx_pb2_grpc as pb_grpc
from ..engine.transactions import Engine
from ..errors import AgentTxError
from . import convert, validation
from .status import status_for

log = logging.getLogger(__name__)

T = TypeVar("T")


def _guard(method: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> T:
        try:
            return await method(self, request, context)
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
