"""Names of the objects the operator creates in the service's namespace for a resource
of another namespace (a policy's sandbox claim, a toolset's header Secret, their pod
volumes).

Why a module of its own: such an object cannot have an ownerReference (owners never
cross namespaces), so its name is the only link back to the resource; it is derived
here, deterministically, so every reconcile finds the same object, and the hash keeps
names unique where the readable part is ambiguous ("a-b"/"c" vs "a"/"b-c") or cut.

What it must never do: perform I/O.
"""

from __future__ import annotations

import hashlib
import re


def identity_hash(namespace: str, name: str) -> str:
    """sha256 of `<namespace>/<name>`, hex."""
    return hashlib.sha256(f"{namespace}/{name}".encode()).hexdigest()


def dns_name(prefix: str, namespace: str, name: str, max_len: int) -> str:
    """`<prefix>-<ns>-<name>-<hash8>`, DNS-1123 safe and at most `max_len` characters."""
    digest = identity_hash(namespace, name)[:8]
    readable = re.sub(r"[^a-z0-9-]", "-", f"{prefix}-{namespace}-{name}".lower())
    readable = readable[: max_len - len(digest) - 1].strip("-")
    return f"{readable}-{digest}"
