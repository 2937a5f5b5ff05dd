"""The Python client for AgentTx (SPEC §10): transactions over an agent's tool calls.

    from agenttx.client import Client, Conflict

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
    # leaving the block committed; an exception inside it would have aborted instead

Asyncio: `AsyncClient`, `async with aclient.transaction(...) as tx: await tx.step(...)`.

Errors derive from `AgentTxError` (`.code` is a `grpc.StatusCode`): `Conflict` for a lost
commit race (the transaction is gone afterwards), `NotFound`, `FailedPrecondition`,
`InvalidArgument`, `Unavailable`, `Unauthenticated`, `ResourceExhausted`, `Internal`, …
When an answer is lost (UNAVAILABLE, DEADLINE_EXCEEDED) the client re-reads the
transaction: a step the re-read proves did not apply is re-sent once (the step id makes
a second application impossible); a commit, a rollback, or a step that may have applied
is never retried and raises `OutcomeUnknown` carrying what the re-read saw. Reads are
retried with backoff. `Client([...])` with one target per replica moves to the next
replica when one stops answering.

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
    TransactionEnded,
    Unauthenticated,
    Unavailable,
)
from .types import (
    CommitResult,
    ContextEntry,
    DeadLetter,
    DeadLetterPage,
    Policy,
    RollbackResult,
    StepResult,
    StepStatus,
    Strategy,
    ToolInfo,
    TransactionPage,
    TransactionState,
    TransactionStatus,
    TransactionSummary,
)

__all__ = [
    "__version__", "DEFAULT_TARGET", "TLS", "AgentTxError", "AsyncClient", "AsyncTransaction", "Cancelled",
    "Client", "CommitResult", "Conflict", "ContextEntry", "DeadLetter", "DeadLetterPage",
    "DeadlineExceeded",
    "FailedPrecondition", "Internal", "InvalidArgument", "NotFound", "OutcomeUnknown",
    "PermissionDenied", "Policy", "ResourceExhausted", "RollbackResult", "StepResult",
    "StepStatus", "Strategy", "ToolInfo", "Transaction", "TransactionEnded", "TransactionPage",
    "TransactionState", "TransactionStatus", "TransactionSummary", "Unauthenticated",
    "Unavailable",
]
