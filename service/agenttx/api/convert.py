"""Domain results -> protobuf messages. No logic beyond field mapping."""

from __future__ import annotations

from collections.abc import Sequence

from agenttx.v1 import agenttx_pb2 as pb

from ..effects.deadletters import DeadLetterPage
from ..engine.model import (
    CommitOutcome,
    RollbackOutcome,
    StepOutcome,
    TransactionPage,
    TransactionView,
)
from ..tools.describe import ToolDescription

STEP_STATUS = {
    "SUCCESS": pb.STEP_STATUS_SUCCESS,
    "ROLLBACK_TRIGGERED": pb.STEP_STATUS_ROLLBACK_TRIGGERED,
    "FAILED": pb.STEP_STATUS_FAILED,
}
TX_STATUS = {
    "ACTIVE": pb.TRANSACTION_STATUS_ACTIVE,
    "AWAITING_ROLLBACK": pb.TRANSACTION_STATUS_AWAITING_ROLLBACK,
}
_STATUS_NAME = {v: k for k, v in TX_STATUS.items()}


def status_name(status: int) -> str:
    """A ListTransactions status filter: "" for any open status."""
    if status == pb.TRANSACTION_STATUS_UNSPECIFIED:
        return ""
    return _STATUS_NAME.get(status, "ENDED")  # type: ignore[call-overload]  # never listed


def step_response(o: StepOutcome) -> pb.ExecuteStepResponse:
    return pb.ExecuteStepResponse(
        status=STEP_STATUS[o.status],
        output_json=o.output_json,
        clean_hint=o.clean_hint,
        strategy=pb.RollbackStrategy.Value(f"ROLLBACK_STRATEGY_{o.strategy.value}"),
        rollback_to_step=o.rollback_to_step,
        next_step_id=o.next_step_id,
        constraints=o.constraints,
        context_reset=o.context_reset,
        error_category=o.error_category,
        rollback_latency_ms=o.rollback_latency_ms,
        abort_reason=o.abort_reason,
        compensation_errors=o.compensation_errors,
    )


def commit_response(o: CommitOutcome) -> pb.CommitTransactionResponse:
    return pb.CommitTransactionResponse(
        committed=o.committed, steps_committed=o.steps_committed,
        effects_dispatched=o.effects_dispatched, dispatch_errors=o.dispatch_errors)


def rollback_response(o: RollbackOutcome) -> pb.RollbackTransactionResponse:
    return pb.RollbackTransactionResponse(
        rolled_back=o.rolled_back, next_step_id=o.next_step_id,
        compensations_run=o.compensations_run, compensation_errors=o.compensation_errors)


def transaction_response(v: TransactionView) -> pb.GetTransactionResponse:
    return pb.GetTransactionResponse(
        transaction_id=v.transaction_id,
        status=TX_STATUS.get(v.status, pb.TRANSACTION_STATUS_UNSPECIFIED),
        next_step_id=v.next_step_id,
        constraints=v.constraints,
        global_resets=v.global_resets,
        agent_id=v.agent_id,
        context=[pb.ContextEntry(step_id=c.step_id, tool_name=c.tool_name,
                                 raw_context=c.raw_context) for c in v.context],
        principal=v.principal,
        created_at=v.created_at,
        updated_at=v.updated_at,
    )


def list_response(page: TransactionPage) -> pb.ListTransactionsResponse:
    return pb.ListTransactionsResponse(
        transactions=[pb.TransactionSummary(
            transaction_id=t.transaction_id,
            status=TX_STATUS.get(t.status, pb.TRANSACTION_STATUS_UNSPECIFIED),
            agent_id=t.agent_id, principal=t.principal, next_step_id=t.next_step_id,
            created_at=t.created_at, updated_at=t.updated_at) for t in page.transactions],
        next_page_token=page.next_page_token)


def tools_response(tools: Sequence[ToolDescription]) -> pb.ListToolsResponse:
    return pb.ListToolsResponse(tools=[
        pb.ToolInfo(name=t.name, description=t.description,
                    input_schema_json=t.input_schema_json, kind=t.kind, toolset=t.toolset)
        for t in tools])


def dead_letters_response(page: DeadLetterPage) -> pb.ListDeadLettersResponse:
    return pb.ListDeadLettersResponse(dead_letters=[
        pb.DeadLetter(idempotency_key=d.idempotency_key, transaction_id=d.transaction_id,
                      channel=d.channel, kind=d.kind, last_error=d.last_error,
                      attempts=d.attempts, dead_at=d.dead_at, principal=d.principal)
        for d in page.letters], next_page_token=page.next_page_token)
