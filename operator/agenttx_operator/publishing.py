"""Publishing policies (SPEC §8) and the service-account issuer keys (SPEC §9) into
etcd, where the service replicas read them.

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
from agenttx.store.client import Store, cmp_mod, cmp_value, op_delete, op_put

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
