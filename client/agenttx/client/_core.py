"""What the sync and asyncio clients share below the flows (`_flows`): channel settings,
request building and response conversion. Pure (no I/O).

The retry rules (carried out by `_flows`):
- reads (GetTransaction, ListTransactions) are retried by gRPC itself on UNAVAILABLE, with
  exponential backoff, through the channel's service config (gRPC's retry policy, see
  https://github.com/grpc/proposal/blob/master/A6-client-retries.md), and then on each
  other replica the client was given (`Endpoints`);
- a step whose answer was lost (UNAVAILABLE, DEADLINE_EXCEEDED) is re-sent once, and only
  when a re-read proves it did not apply (`may_resend`). That is safe because the service
  applies step n only while the transaction's next step is n (SPEC §2): a re-send can never
  apply a step twice;
- nothing else is ever retried: a commit or rollback that ends in UNAVAILABLE or
  DEADLINE_EXCEEDED may have applied, and so may a step the re-read cannot clear. The
  caller raises `OutcomeUnknown` with what the re-read saw (`unknown_outcome` below).
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from ..v1 import agenttx_pb2 as pb
from ._version import __version__
from .errors import AgentTxError, NotFound, OutcomeUnknown
from .types import (
    Approval,
    ApprovalPage,
    CommitResult,
    ContextEntry,
    DeadLetter,
    DeadLetterPage,
    Decision,
    GatedStep,
    HistoryStep,
    Policy,
    RollbackResult,
    ServiceStatus,
    StepResult,
    StepStatus,
    Strategy,
    ToolInfo,
    TransactionHistory,
    TransactionPage,
    TransactionState,
    TransactionStatus,
    TransactionSummary,
)

SERVICE = "agenttx.v1.AgentTxService"
DEFAULT_TARGET = "127.0.0.1:50051"
DEFAULT_TIMEOUT_S = 30.0
# The service accepts 1 MiB of arguments plus 1 MiB of context per step and answers up to
# 4 MiB (server.py); leave headroom both ways.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
UNKNOWN_OUTCOME_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
# What a re-sent step answers when the step id has moved on meanwhile (the lost attempt
# applied after all, or another client acted): re-read and report, as for a lost answer.
MOVED_ON_CODES = frozenset({grpc.StatusCode.FAILED_PRECONDITION})

# Calls that change nothing: retried by gRPC on UNAVAILABLE, then on the next replica.
READ_METHODS = ("GetTransaction", "ListTransactions", "GetTransactionHistory", "ListTools",
                "ListApprovals", "ListDeadLetters", "GetServiceStatus")
_READ_RETRY = {
    "methodConfig": [{
        "name": [{"service": SERVICE, "method": m} for m in READ_METHODS],
        "retryPolicy": {
            "maxAttempts": 5,
            "initialBackoff": "0.1s",
            "maxBackoff": "2s",
            "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE"],
        },
    }],
}


# ---- connection -----------------------------------------------------------------------

class Endpoints:
    """The replicas a client may talk to and the one it talks to now.

    Why the client keeps a list at all: outside a load balancer (replicas addressed one by
    one, as on a developer machine) an agent must not have to notice that its replica
    died. A call that ends in UNAVAILABLE or DEADLINE_EXCEEDED moves the client to the
    next replica, so the re-read and any re-send go to one that answers. With one target
    (a Kubernetes Service, a load balancer) nothing moves: the target itself routes.
    """

    def __init__(self, target: str | Sequence[str]) -> None:
        targets = (target,) if isinstance(target, str) else tuple(target)
        if not targets or not all(isinstance(t, str) and t.strip() for t in targets):
            raise ValueError("target must be a host:port, or a non-empty list of them "
                             f"(one per replica), not {target!r}")
        self.all: tuple[str, ...] = targets
        self.at = 0

    @property
    def current(self) -> str:
        return self.all[self.at]

    def after_error(self, code: grpc.StatusCode) -> None:
        if code in UNKNOWN_OUTCOME_CODES and len(self.all) > 1:
            self.at = (self.at + 1) % len(self.all)


class HasEndpoints:
    """`target` / `targets` for both clients (they set `_endpoints`)."""

    _endpoints: Endpoints

    @property
    def target(self) -> str:
        """The replica the next call goes to."""
        return self._endpoints.current

    @property
    def targets(self) -> tuple[str, ...]:
        return self._endpoints.all


PemSource = str | os.PathLike[str] | bytes


@dataclass(frozen=True)
class TLS:
    """TLS settings for `Client(tls=...)`.

    - `ca`: PEM file (or PEM bytes) of the CA that signed the server's certificate;
      None trusts the system roots (what `tls=True` means).
    - `cert` and `key`: the client certificate and its private key, for mTLS.
    - `server_name`: the name to check in the server's certificate when it differs from
      the host in `target` (e.g. connecting through an IP address or a port-forward).
    """

    ca: PemSource | None = None
    cert: PemSource | None = None
    key: PemSource | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("TLS: a client certificate needs both cert= and key=")

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=_pem(self.ca), private_key=_pem(self.key),
            certificate_chain=_pem(self.cert))


def _pem(source: PemSource | None) -> bytes | None:
    if source is None:
        return None
    if isinstance(source, bytes):
        return source
    return pathlib.Path(source).read_bytes()


def resolve_tls(tls: bool | TLS | None) -> TLS | None:
    if tls is None or tls is False:
        return None
    if tls is True:
        return TLS()
    if isinstance(tls, TLS):
        return tls
    raise TypeError(f"tls must be True, False, None or agenttx.client.TLS, not {type(tls).__name__}")


def channel_options(tls: TLS | None,
                    extra: Sequence[tuple[str, Any]] = ()) -> list[tuple[str, Any]]:
    options: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", json.dumps(_READ_RETRY)),
        ("grpc.primary_user_agent", f"agenttx-python-client/{__version__}"),
    ]
    if tls is not None and tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    options.extend(extra)
    return options


def call_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


# ---- requests --------------------------------------------------------------------------

def begin_request(agent_id: str, metadata: Mapping[str, str] | None,
                  policy: Policy | Mapping[str, Any] | None) -> pb.BeginTransactionRequest:
    req = pb.BeginTransactionRequest(agent_id=agent_id, metadata=dict(metadata or {}))
    chosen = Policy.of(policy)
    if chosen is not None:
        fields = {k: v for k, v in vars(chosen).items() if v is not None}
        req.policy.CopyFrom(pb.RollbackPolicy(**fields))
    return req


def arguments_json(args: Mapping[str, Any] | str | None) -> str:
    """A dict is encoded as JSON (NaN and infinities refused: JSON has none); a str is
    taken as an already-encoded JSON document and sent verbatim."""
    if args is None:
        return "{}"
    if isinstance(args, str):
        return args
    return json.dumps(dict(args), ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def step_request(tx_id: str, step_id: int, tool: str, args: Mapping[str, Any] | str | None,
                 context: str) -> pb.ExecuteStepRequest:
    return pb.ExecuteStepRequest(transaction_id=tx_id, step_id=step_id, tool_name=tool,
                                 arguments_json=arguments_json(args), raw_context=context)


def rollback_request(tx_id: str, to_step: int | None, reason: str) -> pb.RollbackTransactionRequest:
    req = pb.RollbackTransactionRequest(transaction_id=tx_id, reason=reason)
    if to_step is not None:
        req.to_step = to_step
    return req


def list_request(page_size: int, page_token: str, status: TransactionStatus | str | None,
                 agent_id_prefix: str) -> pb.ListTransactionsRequest:
    wire = pb.TRANSACTION_STATUS_UNSPECIFIED
    if status:
        wire = pb.TransactionStatus.Value(f"TRANSACTION_STATUS_{TransactionStatus(status).value}")
    return pb.ListTransactionsRequest(page_size=page_size, page_token=page_token, status=wire,
                                      agent_id_prefix=agent_id_prefix)


def dead_letter_request(idempotency_key: str, reason: str, principal: str
                        ) -> pb.DeadLetterRequest:
    if not isinstance(idempotency_key, str) or not idempotency_key:
        raise ValueError("idempotency_key must be a non-empty string")
    return pb.DeadLetterRequest(idempotency_key=idempotency_key, reason=reason,
                                principal=principal)


def dead_letters_request(page_size: int, page_token: str) -> pb.ListDeadLettersRequest:
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be a positive integer, not {page_size!r}")
    return pb.ListDeadLettersRequest(page_size=page_size, page_token=page_token)


def approvals_request(page_size: int, page_token: str) -> pb.ListApprovalsRequest:
    return pb.ListApprovalsRequest(page_size=page_size, page_token=page_token)


def decide_request(tx_id: str, digest: str, approve: bool, reason: str
                   ) -> pb.DecideApprovalRequest:
    return pb.DecideApprovalRequest(transaction_id=tx_id, digest=digest, approve=approve,
                                    reason=reason)


# ---- responses -------------------------------------------------------------------------

def _strategy(value: int) -> Strategy:
    return Strategy(pb.RollbackStrategy.Name(value).removeprefix("ROLLBACK_STRATEGY_"))


def _tx_status(value: int) -> TransactionStatus:
    try:
        return TransactionStatus(pb.TransactionStatus.Name(value).removeprefix("TRANSACTION_STATUS_"))
    except ValueError:
        return TransactionStatus.UNSPECIFIED


def step_result(resp: pb.ExecuteStepResponse, step_id: int, tool: str) -> StepResult:
    return StepResult(
        step_id=step_id, tool=tool, status=_step_status(resp.status),
        output=json.loads(resp.output_json) if resp.output_json else None,
        output_json=resp.output_json, category=resp.error_category, hint=resp.clean_hint,
        strategy=_strategy(resp.strategy), rollback_to_step=resp.rollback_to_step,
        next_step_id=resp.next_step_id, constraints=tuple(resp.constraints),
        context_reset=resp.context_reset, abort_reason=resp.abort_reason,
        compensation_errors=tuple(resp.compensation_errors),
        rollback_latency_ms=resp.rollback_latency_ms)


def transaction_state(resp: pb.GetTransactionResponse) -> TransactionState:
    return TransactionState(
        transaction_id=resp.transaction_id, status=_tx_status(resp.status),
        next_step_id=resp.next_step_id, constraints=tuple(resp.constraints),
        global_resets=resp.global_resets,
        context=tuple(ContextEntry(c.step_id, c.tool_name, c.raw_context) for c in resp.context),
        agent_id=resp.agent_id, principal=resp.principal, created_at=resp.created_at,
        updated_at=resp.updated_at)


def commit_result(resp: pb.CommitTransactionResponse) -> CommitResult:
    return CommitResult(resp.committed, resp.steps_committed, resp.effects_dispatched,
                        tuple(resp.dispatch_errors), resp.awaiting_approval,
                        resp.approval_digest)


def _step_status(value: int) -> StepStatus:
    try:
        return StepStatus(pb.StepStatus.Name(value).removeprefix("STEP_STATUS_"))
    except ValueError:
        return StepStatus.UNSPECIFIED


def transaction_history(resp: pb.TransactionHistory) -> TransactionHistory:
    return TransactionHistory(
        transaction_id=resp.transaction_id, status=_tx_status(resp.status),
        agent_id=resp.agent_id, principal=resp.principal, created_at=resp.created_at,
        ended_at=resp.ended_at, ended_by=resp.ended_by, reason=resp.reason,
        steps_committed=resp.steps_committed, effects=resp.effects,
        steps=tuple(HistoryStep(s.step_id, s.tool, _step_status(s.status), s.error_category,
                                s.clean_hint, _strategy(s.strategy), s.at, s.arguments_json,
                                s.output_json) for s in resp.steps))


def rollback_result(resp: pb.RollbackTransactionResponse) -> RollbackResult:
    return RollbackResult(resp.rolled_back, resp.next_step_id, resp.compensations_run,
                          tuple(resp.compensation_errors))


def transaction_page(resp: pb.ListTransactionsResponse) -> TransactionPage:
    return TransactionPage(tuple(
        TransactionSummary(t.transaction_id, _tx_status(t.status), t.agent_id, t.principal,
                           t.next_step_id, t.created_at, t.updated_at)
        for t in resp.transactions), resp.next_page_token)


def dead_letter_page(resp: pb.ListDeadLettersResponse) -> DeadLetterPage:
    return DeadLetterPage(tuple(
        DeadLetter(d.idempotency_key, d.transaction_id, d.channel, d.kind, d.last_error,
                   d.attempts, d.dead_at, d.principal)
        for d in resp.dead_letters), resp.next_page_token)


def service_status(resp: pb.ServiceStatus) -> ServiceStatus:
    return ServiceStatus(resp.etcd_reachable, resp.open_transactions, resp.outbox_depth,
                         resp.dead_letters, resp.approvals_pending, resp.replica_id,
                         resp.version, resp.principal, resp.admin)


def approval_page(resp: pb.ListApprovalsResponse) -> ApprovalPage:
    return ApprovalPage(tuple(
        Approval(a.transaction_id, a.principal, a.agent_id, a.digest,
                 tuple(GatedStep(g.step_id, g.tool, g.channel, g.arguments_json)
                       for g in a.gated), tuple(a.write_keys), a.requested_at, a.expires_at)
        for a in resp.approvals), resp.next_page_token)


def decision(resp: pb.DecideApprovalResponse) -> Decision:
    return Decision(_tx_status(resp.status), resp.steps_committed, resp.effects_dispatched,
                    tuple(resp.dispatch_errors))


# ---- lost answers ----------------------------------------------------------------------

def tool_infos(resp: pb.ListToolsResponse) -> list[ToolInfo]:
    return [ToolInfo(t.name, t.description, json.loads(t.input_schema_json or "{}"), t.kind,
                     t.toolset) for t in resp.tools]


def may_resend(state: TransactionState, step_id: int, hints_seen: int | None) -> bool:
    """Whether step `step_id`, whose answer was lost, may be sent again: the re-read
    `state` shows the transaction open and still waiting for this very step, with no
    hint the client had not seen.

    Why the hints: a failed attempt leaves next_step_id where it was (LOCAL_BACKTRACK) but
    appends its hint to the constraints when the hint is new, and that answer is what was
    lost; re-sending would hide it. A failure that repeats a known hint cannot be told
    apart from a call that never arrived; re-sending it runs one more attempt, which has
    no effect on data either (a failed step leaves none). `hints_seen` None (unknown, e.g.
    a transaction attached by id) never re-sends."""
    return (hints_seen is not None and state.status is TransactionStatus.ACTIVE
            and state.next_step_id == step_id and len(state.constraints) == hints_seen)


def reread_outcome(rpc: str, tx_id: str, cause: AgentTxError,
                   reread: TransactionState | AgentTxError, *, step_id: int | None = None,
                   resend_error: AgentTxError | None = None) -> OutcomeUnknown:
    """`unknown_outcome` from what the re-read returned or raised."""
    if isinstance(reread, NotFound):
        return unknown_outcome(rpc, tx_id, cause, step_id=step_id, ended=True,
                               resend_error=resend_error)
    if isinstance(reread, AgentTxError):
        return unknown_outcome(rpc, tx_id, cause, step_id=step_id, reread_error=reread,
                               resend_error=resend_error)
    return unknown_outcome(rpc, tx_id, cause, step_id=step_id, state=reread,
                           resend_error=resend_error)


def unknown_outcome(rpc: str, tx_id: str, cause: AgentTxError, *, step_id: int | None = None,
                    state: TransactionState | None = None, ended: bool = False,
                    reread_error: AgentTxError | None = None,
                    resend_error: AgentTxError | None = None) -> OutcomeUnknown:
    """The error for a step/commit/rollback whose result never arrived, worded from what
    the re-read of the transaction showed. `resend_error`: the step was re-sent once and
    that failed too (lost again, or refused because the step id had moved on)."""
    what = f"step {step_id}" if rpc == "ExecuteStep" else rpc
    head = f"{what} of transaction {tx_id} ended in {cause.code.name} ({cause.details}); "
    if resend_error is None:
        head += "its outcome is unknown and it was not retried"
    else:
        head += (f"a re-read showed it had not applied, so it was re-sent once, which ended "
                 f"in {resend_error.code.name} ({resend_error.details}); its outcome is "
                 "unknown")
    if reread_error is not None:
        seen = (f"the re-read failed too ({reread_error.code.name}: {reread_error.details}); "
                "call get() once the service is reachable")
    elif ended:
        seen = {
            "ExecuteStep": "the transaction no longer exists (the step may have aborted it)",
            "CommitTransaction": "the transaction has ended: the commit applied, unless a "
                                 "conflict or the idle reaper ended it first; check the data",
            "RollbackTransaction": "the transaction has ended",
        }.get(rpc, "the transaction has ended")
    elif state is not None:
        nxt = state.next_step_id
        if rpc == "ExecuteStep" and step_id is not None:
            if nxt == step_id + 1:
                seen = f"the re-read shows next_step_id {nxt}: the step applied"
            elif nxt == step_id:
                seen = (f"the re-read shows next_step_id {nxt}: the step did not apply (or "
                        "failed without undoing anything) as of the re-read")
            else:
                seen = f"the re-read shows next_step_id {nxt}: a rollback happened"
        else:
            seen = (f"the transaction is still open ({state.status.value}, next_step_id "
                    f"{nxt}) as of the re-read")
    else:  # pragma: no cover - every caller passes one of the above
        seen = "nothing could be re-read"
    return OutcomeUnknown(f"{head}; {seen}", code=cause.code, rpc=rpc, transaction_id=tx_id,
                          step_id=step_id, state=state, ended=ended, reread_error=reread_error)
