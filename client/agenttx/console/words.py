"""gRPC errors as sentences a person can act on (docs/console.md, "Errors").

Why here and not in templates: every action of the console ends in one of these, and a
person who is refused must learn *who may* do it, a person who gets NOT_FOUND that the
transaction ended or is not theirs: one table, the same words everywhere. The service's
own details are always kept (after the explanation), so nothing it said is hidden.
"""

from __future__ import annotations

import grpc

from ..client import AgentTxError

# Who may do what (docs/api.md, "Methods"), for PERMISSION_DENIED.
WHO_MAY = {
    "rollback": "admins and the principal that began the transaction",
    "dead letters": "admins",
    "approvals": ("principals with the approver role (in the transaction's namespace or "
                  "the service's) and admins, never the principal that began the "
                  "transaction"),
    "transactions": "every signed-in principal (admins see every transaction, others "
                    "their own)",
}


def describe(err: AgentTxError, action: str, *, topic: str, who: str, target: str) -> str:
    """One paragraph: what failed, why in words, and the service's own details."""
    code, said = err.code, err.details
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return (f"{action} was refused: only {WHO_MAY.get(topic, 'admins')} may do this, "
                f"and you are signed in as {who}. The service said: {said}")
    if code == grpc.StatusCode.NOT_FOUND:
        return (f"{action}: not found. The transaction has ended (or its history has "
                f"expired), or it is not yours: the service shows each principal only "
                f"their own transactions, unless they are an admin. The service said: {said}")
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return f"{action} was refused in the transaction's current state: {said}"
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return f"{action} was refused: the input is not valid: {said}"
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return (f"{action}: the service no longer accepts your token ({said}); sign out "
                "and sign in again.")
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return (f"{action}: the AgentTx service at {target} did not answer ({code.name}: "
                f"{said}). Nothing is known to have changed; look again before retrying.")
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return (f"{action}: the AgentTx service at {target} does not implement this yet "
                f"(UNIMPLEMENTED); upgrade the service.")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return f"{action}: a quota was hit: {said}"
    return f"{action} failed: {code.name}: {said}"


__all__ = ["WHO_MAY", "describe"]
