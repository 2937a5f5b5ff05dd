"""A toolset's status: the Ready condition and its reasons, which generation the service
uses, and how many tools it exposes.

Why a module of its own: `kubectl get attool` is how a person learns whether agents can
use a toolset and, when they cannot, why; and a toolset whose newest generation is not
Ready keeps the last published one, which the status must say (`publishedGeneration`),
or a person would believe nothing is served. Decided here, unit-tested without an API
server.

What it must never do: perform I/O, read the clock (callers pass `now`) or put a
header's value anywhere (messages name Secrets and keys, never what they hold).
Building the status of an unchanged toolset again yields an identical status.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .conditions import CONDITION_READY, condition, find_condition

REASON_PUBLISHED = "Published"
# The spec is wrong (the field is named) or its prefix is another toolset's.
REASON_INVALID_SPEC = "InvalidSpec"
# tools/list failed: connection, timeout, HTTP error. Retried with backoff.
REASON_UPSTREAM_UNREACHABLE = "UpstreamUnreachable"
# The upstream lacks a listed tool or compensation tool (named). Retried with backoff.
REASON_UNKNOWN_TOOL = "UnknownTool"
# A header's Secret or key does not exist, or cannot be read. Retried with backoff.
REASON_SECRET_NOT_FOUND = "SecretNotFound"
# A header's Secret value cannot be sent as a header value (e.g. a line break in it).
REASON_SECRET_INVALID = "SecretInvalid"
# The service Deployment is rolling out the pods with the header files.
REASON_PROJECTION_PENDING = "ProjectionPending"
REASON_ETCD_UNAVAILABLE = "EtcdUnavailable"

# Reasons after which the same spec cannot become Ready on its own: a person must act.
PERMANENT = frozenset({REASON_INVALID_SPEC})


def published_note(status: Mapping[str, Any] | None) -> str:
    """"; generation N stays published" when an older generation is served, else ""."""
    gen = (status or {}).get("publishedGeneration")
    return f"; generation {gen} stays published" if gen else ""


def build_status(
    old_status: Mapping[str, Any] | None,
    *,
    generation: int,
    reason: str,
    message: str,
    now: str,
    published: tuple[int, int] | None = None,
    header_secret: str | None = None,
) -> dict[str, Any]:
    """The toolset's status after a reconcile of `generation`.

    `published` is (generation, number of tools) when this reconcile published, None
    when it did not: then what an earlier reconcile published stays in the status, as
    it stays in etcd. `header_secret` is the copy of the header values
    ("<ns>/<name>", "" for none; None: as it was). Ready is True only for `Published`.
    Conditions of other types are kept as they were."""
    old_status = old_status or {}
    conditions = [dict(c) for c in old_status.get("conditions") or []
                  if isinstance(c, Mapping) and c.get("type") != CONDITION_READY]
    conditions.append(condition(find_condition(old_status, CONDITION_READY), CONDITION_READY,
                                reason == REASON_PUBLISHED, reason, message, generation, now))
    status: dict[str, Any] = {"observedGeneration": generation, "conditions": conditions}
    if published is not None:
        status["publishedGeneration"], status["tools"] = published
    else:
        if old_status.get("publishedGeneration"):
            status["publishedGeneration"] = old_status["publishedGeneration"]
        status["tools"] = int(old_status.get("tools") or 0)
    status["headerSecret"] = (str(old_status.get("headerSecret") or "") if header_secret is None
                              else header_secret)
    return status
