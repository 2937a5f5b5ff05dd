"""Domain results -> protobuf messages. No logic beyond field mapping."""

from __future__ import annotations

from collections.abc import Sequence

from agenttx.v1 import agenttx_pb2 as pb

from ..effects.deadletters import DeadLetterPage
from ..engine.model import (
    ApprovalPage,
    Caller,
    CommitOutcome,
    DecisionOutcome,
    RollbackOutcome,
    StepOutcome,
    TransactionHistory,
    TransactionPage,
    TransactionView,
)
from ..engine.status import ServiceCounts
from ..tools.describe import ToolDescription

STEP_STATUS = {
    "SUCCESS": pb.STEP_STATUS_SUCCESS,
    "ROLLBACK_TRIGGERED": pb.STEP_STATUS_ROLLBACK_TRIGGERED,
    "FAILED": pb.STEP_STATUS_FAILED,
}
TX_STATUS = {
    "ACTIVE": pb.TRANSACTION_STATUS_ACTIVE,
    "AWAITING_ROLLBACK": pb.TRANSACTION_STATUS_AWAITING_ROLLBACK,
    "AWAITING_APPROVAL": pb.TRANSACTION_STATUS_AWAITING_APPROVAL,
    "COMMITTED": pb.TRANSACTION_STATUS_COMMITTED,
    "ABORTED": pb.TRANSACTION_STATUS_ABORTED,
    "EXPIRED": pb.TRANSACTION_STATUS_EXPIRED,
    "REJECTED": pb.TRANSACTION_STATUS_REJECTED,
}
OPEN_STATUSES = frozenset({"ACTIVE", "AWAITING_ROLLBACK", "AWAITING_APPROVAL"})
_STATUS_NAME = {v: k for k, v in TX_STATUS.items()}


def status_name(status: int) -> str:
    """A ListTransactions status filter: "" for any open status; an ended status (or one
    this service does not know) matches nothing, as no open transaction has it."""
    if status == pb.TRANSACTION_STATUS_UNSPECIFIED:
        return ""
    name = _STATUS_NAME.get(status, "ENDED")  # type: ignore[call-overload]
    return str(name) if name in OPEN_STATUSES else "ENDED"


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
        effects_dispatched=o.effects_dispatched, dispatch_errors=o.dispatch_errors,
        awaiting_approval=o.awaiting_approval, approval_digest=o.approval_digest)


def approvals_response(page: ApprovalPage) -> pb.ListApprovalsResponse:
    return pb.ListApprovalsResponse(approvals=[pb.Approval(
        transaction_id=a.transaction_id, principal=a.principal, agent_id=a.agent_id,
        digest=a.digest, gated=[pb.GatedStep(step_id=g.step_id, tool=g.tool,
                                             channel=g.channel, arguments_json=g.arguments_json)
                                for g in a.gated],
        write_keys=a.write_keys, requested_at=a.requested_at, expires_at=a.expires_at)
        for a in page.approvals], next_page_token=page.next_page_token)


def decision_response(o: DecisionOutcome) -> pb.DecideApprovalResponse:
    return pb.DecideApprovalResponse(
        status=TX_STATUS.get(o.status, pb.TRANSACTION_STATUS_UNSPECIFIED),
        steps_committed=o.steps_committed, effects_dispatched=o.effects_dispatched,
        dispatch_errors=o.dispatch_errors)


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


def history_response(h: TransactionHistory) -> pb.TransactionHistory:
    return pb.TransactionHistory(
        transaction_id=h.transaction_id,
        status=TX_STATUS.get(h.status, pb.TRANSACTION_STATUS_UNSPECIFIED),
        agent_id=h.agent_id, principal=h.principal, created_at=h.created_at,
        ended_at=h.ended_at, ended_by=h.ended_by, reason=h.reason,
        steps_committed=h.steps_committed, effects=h.effects,
        steps=[pb.HistoryStep(
            step_id=e.step_id, tool=e.tool,
            status=STEP_STATUS.get(e.status, pb.STEP_STATUS_UNSPECIFIED),
            error_category=e.category, clean_hint=e.hint,
            strategy=pb.RollbackStrategy.Value(f"ROLLBACK_STRATEGY_{e.strategy}"),
            at=e.at, arguments_json=e.arguments_json, output_json=e.output_json)
            for e in h.steps])


def status_response(counts: ServiceCounts, replica_id: str, version: str,
                    caller: Caller) -> pb.ServiceStatus:
    """Without authentication every (loopback) caller acts as an admin."""
    return pb.ServiceStatus(
        etcd_reachable=counts.etcd_reachable, open_transactions=counts.open_transactions,
        outbox_depth=counts.outbox_depth, dead_letters=counts.dead_letters,
        approvals_pending=counts.approvals_pending, replica_id=replica_id, version=version,
        principal=caller.principal, admin=caller.admin or not caller.authenticated)
