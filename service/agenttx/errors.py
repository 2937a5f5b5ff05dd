"""Domain errors. They know nothing of gRPC; api/status.py maps each to one status code.

Why a closed set: the servicer must never answer UNKNOWN and never leak a traceback, so
every failure the engine means to report is one of these, each with a message written
for the caller. Anything else is a bug, logged with its traceback and answered INTERNAL.
"""

from __future__ import annotations


class AgentTxError(Exception):
    """Base of every error the engine reports on purpose."""


class InvalidArgument(AgentTxError):
    """The request is malformed; nothing changed."""


class NotFound(AgentTxError):
    """Unknown or ended transaction."""


class FailedPrecondition(AgentTxError):
    """Wrong step order, or the transaction is not in a state that allows the call."""


class Conflict(AgentTxError):
    """Write-write conflict at commit; the transaction was compensated and ended."""


class StoreError(AgentTxError):
    """etcd answered with an error (storage failure)."""


class StoreUnavailable(StoreError):
    """etcd could not be reached; nothing was written (or the write's fate was checked)."""


class Unauthenticated(AgentTxError):
    """Missing, invalid or expired credentials (docs/security.md#authentication---auth). The
    message is exactly one of "missing credentials", "invalid credentials", "expired credentials": never which
    check failed, never the credential itself."""


class ResourceExhausted(AgentTxError):
    """A per-principal quota was hit (docs/security.md#quotas); the message names the limit."""


class PermissionDenied(AgentTxError):
    """An authenticated principal asked for an admin-only operation (ListTransactions)."""
