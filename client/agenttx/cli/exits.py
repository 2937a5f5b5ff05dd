"""Exit codes of the `agenttx` commands for people (`tx`, `approvals`, `effects`), in one
place so every command means the same by the same number (docs/client.md, "Exit codes"):

    0  done
    1  rollback incomplete (the compensation errors on stderr), or an approved
       transaction whose commit a conflict aborted (compensated)
    2  usage: bad flags or values, refused before any call (one line on stderr)
    3  not found (unknown id, another principal's transaction, or history expired)
    4  permission denied (or missing / invalid credentials)
    5  digest mismatch / not pending (approvals)
    6  the service failed or could not be reached (the target on stderr)
"""

from __future__ import annotations

from ..client import AgentTxError, InvalidArgument, NotFound, PermissionDenied, Unauthenticated

OK, INCOMPLETE, USAGE, NOT_FOUND, DENIED, NOT_PENDING, SERVICE = 0, 1, 2, 3, 4, 5, 6


def for_error(err: AgentTxError) -> int:
    """The exit code for an error a command could not handle itself."""
    if isinstance(err, NotFound):
        return NOT_FOUND
    if isinstance(err, InvalidArgument):
        return USAGE
    if isinstance(err, PermissionDenied | Unauthenticated):
        return DENIED
    return SERVICE


__all__ = ["DENIED", "INCOMPLETE", "NOT_FOUND", "NOT_PENDING", "OK", "SERVICE", "USAGE",
           "for_error"]
