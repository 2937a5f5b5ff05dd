"""Request validation (docs/api.md#status-codes). Every rule raises InvalidArgument and changes nothing.

A malformed `arguments_json` is deliberately NOT checked here: it is a failed step
with a hint (docs/recovery.md#1-the-error-cleaner), not an RPC error. Only its size is an
RPC-level limit.
"""

from __future__ import annotations

import math
import re
import uuid
from typing import Any

from ..contracts.policy import DEPTH_MAX, DEPTH_MIN, FACTOR_MAX, FACTOR_MIN
from ..engine.model import Caller
from ..errors import InvalidArgument, NotFound, PermissionDenied

MAX_AGENT_ID_BYTES = 256
MAX_METADATA_ENTRIES = 64
MAX_TOOL_NAME_BYTES = 128
MAX_DOCUMENT_BYTES = 1024 * 1024  # arguments_json and raw_context: 1 MiB each
DEPTH_RANGE = (DEPTH_MIN, DEPTH_MAX)
FACTOR_RANGE = (FACTOR_MIN, FACTOR_MAX)


def _bytes(text: str) -> int:
    return len(text.encode("utf-8", errors="surrogatepass"))


def transaction_id(value: str) -> str:
    if not value:
        raise InvalidArgument("transaction_id is required")
    return value


# The form we hand out (str(uuid4())): accepted as is, without building a UUID per call.
_CANONICAL_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def known_transaction_id(value: str) -> str:
    """Checked after every INVALID_ARGUMENT rule, so bad input is reported first."""
    if _CANONICAL_ID.fullmatch(value):
        return value
    try:
        parsed = uuid.UUID(value)
    except ValueError:
        # We only ever hand out UUIDs, so this names no transaction (and never reaches
        # etcd as a key).
        raise NotFound(f"transaction {value[:64]!r} not found (not a transaction id)") from None
    return str(parsed)


def begin(agent_id: str, metadata: dict[str, str], policy: Any | None) -> dict[str, Any]:
    if _bytes(agent_id) > MAX_AGENT_ID_BYTES:
        raise InvalidArgument(f"agent_id is {_bytes(agent_id)} bytes; the limit is "
                              f"{MAX_AGENT_ID_BYTES}")
    if len(metadata) > MAX_METADATA_ENTRIES:
        raise InvalidArgument(f"metadata has {len(metadata)} entries; the limit is "
                              f"{MAX_METADATA_ENTRIES}")
    overrides: dict[str, Any] = {}
    if policy is None:
        return overrides
    for name in ("max_local_depth", "max_global_resets"):
        if policy.HasField(name):
            v = getattr(policy, name)
            lo, hi = DEPTH_RANGE
            if not lo <= v <= hi:
                raise InvalidArgument(f"policy.{name} is {v}; it must be between {lo} and {hi}")
            overrides[name] = v
    if policy.HasField("replay_budget_factor"):
        factor = float(policy.replay_budget_factor)
        flo, fhi = FACTOR_RANGE
        if not math.isfinite(factor) or not flo <= factor <= fhi:
            raise InvalidArgument(f"policy.replay_budget_factor is {factor}; it must be a finite "
                                  f"number between {flo} and {fhi:g}")
        overrides["replay_budget_factor"] = factor
    return overrides


def step(step_id: int, tool_name: str, arguments_json: str, raw_context: str) -> None:
    if step_id == 0:
        raise InvalidArgument("step_id must be at least 1")
    if not tool_name:
        raise InvalidArgument("tool_name is required")
    if _bytes(tool_name) > MAX_TOOL_NAME_BYTES:
        raise InvalidArgument(f"tool_name is {_bytes(tool_name)} bytes; the limit is "
                              f"{MAX_TOOL_NAME_BYTES}")
    if _bytes(arguments_json) > MAX_DOCUMENT_BYTES:
        raise InvalidArgument(f"arguments_json is {_bytes(arguments_json)} bytes; the limit is "
                              f"{MAX_DOCUMENT_BYTES} (1 MiB)")
    if _bytes(raw_context) > MAX_DOCUMENT_BYTES:
        raise InvalidArgument(f"raw_context is {_bytes(raw_context)} bytes; the limit is "
                              f"{MAX_DOCUMENT_BYTES} (1 MiB)")


def page_token(token: str) -> str:
    """Page tokens are the last transaction id of the previous page."""
    if not token:
        return ""
    try:
        return str(uuid.UUID(token))
    except ValueError:
        raise InvalidArgument("page_token is not a token this service handed out") from None


def admin_only(caller: Caller, rpc: str) -> None:
    """Dead letters are for admins (docs/operations.md): with authentication on, only
    principals with the admin role; without it every (loopback) caller is one."""
    if caller.authenticated and not caller.admin:
        raise PermissionDenied(f"{rpc} needs the admin role")


MAX_REASON_BYTES = 1024
DIGEST_HEX_DIGITS = 64  # SHA-256


def decision(digest: str, approve: bool, reason: str) -> None:
    """DecideApproval (docs/approvals.md): approving names the digest the approver saw (64
    lowercase hex digits); rejecting needs no digest (rejecting is always safe) but a
    reason, which goes into the history and the audit log."""
    if approve and (len(digest) != DIGEST_HEX_DIGITS
                    or any(c not in "0123456789abcdef" for c in digest)):
        raise InvalidArgument("digest must be the 64 lowercase hex digits ListApprovals "
                              "shows for the transaction (approving needs it)")
    if not approve and not reason.strip():
        raise InvalidArgument("reason is required to reject (it goes into the transaction's "
                              "history and the audit log)")
    if _bytes(reason) > MAX_REASON_BYTES:
        raise InvalidArgument(f"reason is {_bytes(reason)} bytes; the limit is "
                              f"{MAX_REASON_BYTES}")


def dead_letter(idempotency_key: str, reason: str, *, reason_required: bool) -> None:
    """Any non-empty key is looked up: letters committed before keys were checked at
    staging may hold keys that staging refuses today, and must still be resolvable."""
    if not idempotency_key:
        raise InvalidArgument("idempotency_key is required")
    if reason_required and not reason.strip():
        raise InvalidArgument("reason is required: say why the effect is dropped (it goes "
                              "into the audit log)")
    if _bytes(reason) > MAX_REASON_BYTES:
        raise InvalidArgument(f"reason is {_bytes(reason)} bytes; the limit is "
                              f"{MAX_REASON_BYTES}")
