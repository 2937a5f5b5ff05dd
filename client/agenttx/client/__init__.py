"""The Python client for AgentTx: transactions over an agent's tool calls (docs/client.md).

    from agenttx.client import Client, StepFailed

    client = Client("127.0.0.1:50051")                 # plaintext; tls=True for TLS
    with client.transaction(agent_id="billing-agent") as tx:
        tx.step("record.insert", {"table": "customers", "id": 1, "fields": {"name": "Ada"}})
        r = tx.step("record.insert", {"table": "orders", "id": "o-1",
                                      "fields": {"customer_id": 2},
                                      "references": {"customer_id": "customers"}})
        if not r.ok:                       # a failed step is a result, not an exception
            print(r.category, r.hint)      # foreign_key_violation  Field "customer_id" …
            print(r.strategy, r.next_step_id)   # Strategy.LOCAL_BACKTRACK 2
            r = tx.step("record.insert", {"table": "orders", "id": "o-1",
                                          "fields": {"customer_id": "${steps.1.id}"},
                                          "references": {"customer_id": "customers"}})
        tx.commit()                        # this code recovered from the failure: it says so

Leaving the block is never silent: after an explicit commit or abort it does nothing
more; when a step in the block failed (and nobody committed) it rolls back and raises
`StepFailed`; when the service ended the transaction (an ABORT, the idle reaper, an
admin) it raises `TransactionEnded`, whose `.history` says how; otherwise it commits.
An exception leaving the block aborts the transaction. `strict=True` raises `StepFailed`
at the failing step. `client.history(tx_id)` reads any transaction's record, ended ones
included.

Approvals (docs/approvals.md): a commit whose steps need a person's approval returns
`awaiting_approval` and a digest; `tx.commit(wait_for_approval=SECONDS)` waits for the
decision. Approvers use `client.approvals()`, `client.approve(tx_id, digest)` and
`client.reject(tx_id, reason)`.

Asyncio: `AsyncClient`, `async with aclient.transaction(...) as tx: await tx.step(...)`,
with the same rules (both front ends run the same flows, `_flows`).

Errors derive from `AgentTxError` (`.code` is a `grpc.StatusCode`): `Conflict` for a lost
commit race (the transaction is gone afterwards), `NotFound`, `FailedPrecondition`,
`InvalidArgument` (also raised by the client itself for bad input, before any call),
`Unavailable`, `Unauthenticated`, `ResourceExhausted`, `Internal`, … When an answer is
lost (UNAVAILABLE, DEADLINE_EXCEEDED) the client re-reads the transaction: a step the
re-read proves did not apply is re-sent once (the step id makes a second application
impossible); a commit, a rollback, or a step that may have applied is never retried and
raises `OutcomeUnknown` carrying what the re-read saw. Reads are retried with backoff.
`Client([...])` with one target per replica moves to the next replica when one stops
answering.

This package is the public surface; it must not leak generated protobuf types.
"""

from ._aio import AsyncClient, AsyncTransaction
from ._core import DEFAULT_TARGET, TLS
from ._sync import Client, Transaction
from ._version import __version__
from .errors import (
    AgentTxError,
    Cancelled,
    Conflict,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    OutcomeUnknown,
    PermissionDenied,
    ResourceExhausted,
    StepFailed,
    TransactionEnded,
    Unauthenticated,
    Unavailable,
)
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

__all__ = [
    "__version__", "DEFAULT_TARGET", "TLS", "AgentTxError", "Approval", "ApprovalPage",
    "AsyncClient", "AsyncTransaction", "ServiceStatus",
    "Cancelled", "Client", "CommitResult", "Conflict", "ContextEntry", "DeadLetter",
    "DeadLetterPage", "DeadlineExceeded", "Decision", "FailedPrecondition", "GatedStep",
    "HistoryStep", "Internal",
    "InvalidArgument", "NotFound", "OutcomeUnknown", "PermissionDenied", "Policy",
    "ResourceExhausted", "RollbackResult", "StepFailed", "StepResult", "StepStatus", "Strategy",
    "ToolInfo", "Transaction", "TransactionEnded", "TransactionHistory", "TransactionPage",
    "TransactionState", "TransactionStatus", "TransactionSummary", "Unauthenticated",
    "Unavailable",
]
