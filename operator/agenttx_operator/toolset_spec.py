"""An AgentTxToolset's spec: the resource's identity, the record it becomes when published
(`agenttx.contracts.toolsets.Toolset`, with its headers as files in the service pods),
the Secret keys it needs, and the checks a schema cannot make.

Why a module of its own: the CRD schema enforces most of the spec, but an object can
reach the operator without it (an old CRD), and some rules need more than the object:
its prefix must be unique among the namespace's toolsets, and every tool it names must
exist on the upstream. Those decisions are pure functions here, unit-tested without an
API server; the parsing itself is the contract's (`from_spec`), so the service and the
operator can never disagree on what a valid toolset is.

What it must never do: perform I/O, mutate its arguments, or hold a header's value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agenttx.contracts.toolsets import Toolset, ToolsetError, from_spec

GROUP = "agenttx.io"
VERSION = "v1alpha1"
PLURAL = "agenttxtoolsets"
KIND = "AgentTxToolset"

# Where the operator projects header Secrets into the service pods:
# <root>/<toolset ns>/<toolset name>/<secret>/<key>.
DEFAULT_MOUNT_ROOT = "/etc/agenttx/toolsets"


@dataclass(frozen=True, order=True)
class SecretRef:
    """One key of a Secret in the toolset's namespace (a header's `secretKeyRef`)."""

    secret: str
    key: str

    def describe(self, namespace: str) -> str:
        return f"key {self.key!r} of Secret {namespace}/{self.secret}"


def mount_path(namespace: str, name: str, mount_root: str = DEFAULT_MOUNT_ROOT) -> str:
    """The directory of a toolset's header files in every service pod."""
    return f"{mount_root.rstrip('/')}/{namespace}/{name}"


def file_path(ref: SecretRef) -> str:
    """A Secret key's file, relative to the toolset's directory: `<secret>/<key>`.

    Unambiguous and safe as a path: Secret names are DNS subdomains (no `/`) and keys
    match `[-._a-zA-Z0-9]+`, never `.` or `..` (the API server refuses those)."""
    return f"{ref.secret}/{ref.key}"


def header_file(namespace: str, name: str, ref: SecretRef,
                mount_root: str = DEFAULT_MOUNT_ROOT) -> str:
    """The absolute path of a header's value in every service pod."""
    return f"{mount_path(namespace, name, mount_root)}/{file_path(ref)}"


def secret_refs(spec: Any) -> tuple[SecretRef, ...]:
    """The Secret keys a spec's headers name, each once, in order of first use.

    Tolerates any spec (deletion and clean-up must work for an invalid toolset too):
    what is not a well-formed `secretKeyRef` is skipped here and refused by `parse`."""
    if not isinstance(spec, Mapping):
        return ()
    upstream = spec.get("upstream")
    headers = upstream.get("headers") if isinstance(upstream, Mapping) else None
    refs: dict[SecretRef, None] = {}
    for header in headers if isinstance(headers, list) else []:
        ref = header.get("secretKeyRef") if isinstance(header, Mapping) else None
        if (isinstance(ref, Mapping) and isinstance(ref.get("name"), str) and ref["name"]
                and isinstance(ref.get("key"), str) and ref["key"]):
            refs[SecretRef(ref["name"], ref["key"])] = None
    return tuple(refs)


def header_refs(spec: Mapping[str, Any]) -> dict[str, SecretRef]:
    """Header name -> the Secret key holding its value (for a spec `parse` accepted)."""
    return {h["name"]: SecretRef(h["secretKeyRef"]["name"], h["secretKeyRef"]["key"])
            for h in spec["upstream"].get("headers", [])}


def parse(namespace: str, name: str, generation: int, spec: Any, *,
          mount_root: str = DEFAULT_MOUNT_ROOT) -> Toolset:
    """The toolset as published: the contract's record, each header read from the file
    its Secret key is projected to. Raises ToolsetError naming the field.

    The CRD form only: a header's value comes from a `secretKeyRef`, never a literal
    `value` or a `file` of the user's choosing (those belong to `--toolsets-file`)."""
    upstream = spec.get("upstream") if isinstance(spec, Mapping) else None
    headers = upstream.get("headers") if isinstance(upstream, Mapping) else None
    for i, header in enumerate(headers if isinstance(headers, list) else []):
        if isinstance(header, Mapping) and "file" in header:
            raise ToolsetError(f"spec.upstream.headers[{i}].file is for toolsets files; in "
                               "an AgentTxToolset take the value from a Secret (secretKeyRef)")
    return from_spec(
        namespace, name, generation, spec,
        secret_path=lambda secret, key: header_file(namespace, name, SecretRef(secret, key),
                                                    mount_root),
    )


def _created(item: Mapping[str, Any]) -> tuple[str, str]:
    meta = item.get("metadata") or {}
    return str(meta.get("creationTimestamp") or ""), str(meta.get("name") or "")


def prefix_owner(me: Mapping[str, Any], others: Iterable[Mapping[str, Any]]) -> str | None:
    """The name of the toolset of the same namespace that holds `me`'s prefix, or None
    when `me` may use it.

    Two toolsets of one namespace with the same prefix would expose the same tool names.
    The oldest (creationTimestamp, then name) keeps the prefix, so adding a toolset can
    never take a working one's tools away; the newer one is refused, naming the holder.
    A toolset being deleted holds nothing."""
    meta = me.get("metadata") or {}
    prefix = (me.get("spec") or {}).get("prefix")
    mine = _created(me)
    holders = []
    for other in others:
        o_meta = other.get("metadata") or {}
        if (o_meta.get("name") == meta.get("name")
                or o_meta.get("namespace", meta.get("namespace")) != meta.get("namespace")
                or o_meta.get("deletionTimestamp")
                or (other.get("spec") or {}).get("prefix") != prefix):
            continue
        if _created(other) < mine:
            holders.append(_created(other))
    return min(holders)[1] if holders else None


def missing_tools(toolset: Toolset, available: Iterable[str]) -> list[str]:
    """The upstream tools the toolset names (its tools and their compensations) that the
    upstream's tools/list does not offer, sorted."""
    return sorted(toolset.upstream_tools() - set(available))
