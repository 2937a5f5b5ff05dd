"""Publishing policies, toolsets (docs/toolsets.md) and the service-account issuer keys
(docs/security.md) into etcd, where the service replicas read them.

Why etcd and not the Kubernetes API: the service pods keep all their state in etcd and
get no Kubernetes API rights, so the operator is the only bridge between the two.

What it must never do: open its own etcd connection (it uses `agenttx.store.client`,
the project's one gateway), build a key itself (every key comes from the service's
`agenttx.contracts.layout.Keys`, so both processes agree on `--etcd-prefix agenttx` and
`/agenttx` alike), or retry on its own; a StoreUnavailable goes back to the caller (a
handler reports EtcdUnavailable and lets kopf retry with backoff; the issuer-key
refresher keeps what is published and retries with backoff).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from agenttx.contracts.layout import Keys
from agenttx.contracts.policy import PublishedPolicy
from agenttx.contracts.toolsets import Toolset, ToolsetError, parse_published, to_json
from agenttx.store.client import Store, cmp_mod, cmp_value, op_delete, op_get, op_put

from . import lifecycle, policy_spec

log = logging.getLogger(__name__)


async def publish(store: Store, keys: Keys, policy: PublishedPolicy) -> bool:
    """Write the policy unless etcd already holds exactly these bytes (one round trip).

    Returns True when it wrote. Idempotent: an unchanged policy is never rewritten, so
    the service's watchers see no spurious event on a resume or a status-only change.
    """
    key = keys.policy(policy.namespace, policy.name)
    value = policy_spec.publish_payload(policy)
    result = await store.txn(
        [cmp_value(key, value)], [], [op_put(key, value)], what="publish policy"
    )
    return not result.succeeded


async def publish_jwks(store: Store, keys: Keys, value: bytes) -> bool:
    """Write the issuer keys document (`jwks.encode`'s bytes) unless etcd already holds
    exactly these bytes (one round trip). Returns True when it wrote. Never deletes:
    keeping the last good keys is the answer to every failure upstream."""
    key = keys.auth_jwks()
    result = await store.txn(
        [cmp_value(key, value)], [], [op_put(key, value)], what="publish issuer keys"
    )
    return not result.succeeded


async def unpublish(store: Store, keys: Keys, namespace: str, name: str) -> None:
    """Remove the policy's key (absent is fine)."""
    await store.txn([], [op_delete(keys.policy(namespace, name))], what="unpublish policy")


async def sweep_orphans(
    store: Store,
    keys: Keys,
    published: dict[bytes, int],
    existing_policies: Iterable[tuple[str, str]],
    namespaces: Iterable[str] | None,
) -> list[bytes]:
    """Delete published keys whose AgentTxPolicy is gone (e.g. its finalizer gave up
    while etcd was down). Returns the keys removed.

    Order matters: the caller reads `published` (`read_published`) from etcd *before*
    listing the policies, and each delete compares the mod_revision, so a policy created
    or republished in between is never removed.
    """
    removed: list[bytes] = []
    orphans = lifecycle.orphaned_keys(published, existing_policies, keys, namespaces)
    for key, rev in sorted(orphans.items()):
        result = await store.txn([cmp_mod(key, rev)], [op_delete(key)], [], what="sweep policy")
        if result.succeeded:
            log.info("unpublished orphaned policy %s", key.decode("utf-8", "replace"))
            removed.append(key)
    return removed


async def read_published(store: Store, keys: Keys) -> dict[bytes, int]:
    """Every published policy key with its mod_revision."""
    kvs = await store.get_prefix(keys.policies_prefix())
    return {kv.key: kv.mod_revision for kv in kvs}


# ---- toolsets ---------------------------------------------------------------------

# A compare lost to another writer is re-read and decided again, this many times. The
# operator is the only writer (one replica, one reconcile per toolset at a time), so
# losing twice in a row means something else writes the key: report it, do not spin.
PUBLISH_ATTEMPTS = 3


class StalePublish(Exception):
    """etcd already holds a newer generation of the toolset than the one being
    published (this reconcile read an old version of the resource)."""


async def publish_toolset(store: Store, keys: Keys, toolset: Toolset) -> bool:
    """Write the toolset's published form unless etcd already holds exactly these bytes.
    Returns True when it wrote.

    Guarded by compare-and-swap on the key's mod_revision as read, and never over a
    newer generation (StalePublish). A lost compare returns the current value in the
    same round trip (the failure branch reads it), so the decision is made again on
    what is there, never by retrying blindly. A timeout raises StoreUnavailable; the
    caller's next attempt starts again from a fresh read.
    """
    key = keys.toolset(toolset.namespace, toolset.name)
    value = to_json(toolset)
    current = await store.get(key, what="read toolset")
    for _ in range(PUBLISH_ATTEMPTS):
        if current is not None:
            if current.value == value:
                return False
            try:
                live = parse_published(current.value)
            except ToolsetError:
                live = None  # unreadable: overwritten by a valid record
            if live is not None and live.generation > toolset.generation:
                raise StalePublish(f"{key.decode()} holds generation {live.generation}, newer "
                                   f"than {toolset.generation}")
        seen = current.mod_revision if current is not None else 0
        result = await store.txn([cmp_mod(key, seen)], [op_put(key, value)], [op_get(key)],
                                 what="publish toolset")
        if result.succeeded:
            return True
        current = result.first(0)
    raise StalePublish(f"{key.decode()} kept changing while it was published; another writer?")


async def unpublish_toolset(store: Store, keys: Keys, namespace: str, name: str) -> bool:
    """Remove the toolset's key, compare-and-swap on what was read (absent is fine).
    Returns True when it deleted something."""
    key = keys.toolset(namespace, name)
    current = await store.get(key, what="read toolset")
    for _ in range(PUBLISH_ATTEMPTS):
        if current is None:
            return False
        result = await store.txn([cmp_mod(key, current.mod_revision)], [op_delete(key)],
                                 [op_get(key)], what="unpublish toolset")
        if result.succeeded:
            return True
        current = result.first(0)
    raise StalePublish(f"{key.decode()} kept changing while it was unpublished")


async def read_published_toolsets(store: Store, keys: Keys) -> dict[bytes, int]:
    """Every published toolset key with its mod_revision."""
    kvs = await store.get_prefix(keys.toolsets_prefix(), what="read toolsets")
    return {kv.key: kv.mod_revision for kv in kvs}


async def sweep_orphaned_toolsets(
    store: Store,
    keys: Keys,
    published: dict[bytes, int],
    existing: Iterable[tuple[str, str]],
    namespaces: Iterable[str] | None,
) -> list[bytes]:
    """Delete published toolset keys whose AgentTxToolset is gone (its finalizer gave
    up while etcd was down). Same order and compare as `sweep_orphans`."""
    removed: list[bytes] = []
    orphans = lifecycle.orphaned_toolset_keys(published, existing, keys, namespaces)
    for key, rev in sorted(orphans.items()):
        result = await store.txn([cmp_mod(key, rev)], [op_delete(key)], [],
                                 what="sweep toolset")
        if result.succeeded:
            log.info("unpublished orphaned toolset %s", key.decode("utf-8", "replace"))
            removed.append(key)
    return removed
