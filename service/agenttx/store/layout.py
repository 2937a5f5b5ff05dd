"""The etcd key layout. Every key the service writes is built here, nowhere else.

    <prefix>/tx/<id>/header           transaction header (JSON; the CAS anchor)
    <prefix>/tx/<id>/step/<n:010d>    one record per live step (JSON)
    <prefix>/tx/<id>/touch            last read-only activity (GetTransaction), for the reaper
    <prefix>/data/kv/<key>            committed kv values
    <prefix>/data/rec/<table>/<id>    committed record rows (id JSON-encoded: 7 != "7")
    <prefix>/locks/fs/<root+path>     fs path lock: value = holding transaction id
    <prefix>/outbox/<id>/<seq:06d>    committed, not yet delivered effects
    <prefix>/outcomes/<id>            how a transaction ended (short-lived, leased)
    <prefix>/policies/<ns>/<name>     published AgentTxPolicy (written by the operator)
    <prefix>/auth/jwks                service-account issuer keys (written by the operator)
    <prefix>/replicas/<replica-id>    liveness of a service replica (leased)
    <prefix>/leader/<role>            leader election (dispatcher, reaper)

Several deployments can share one etcd by using different prefixes. Variable parts are
percent-encoded so that no user-supplied key can reach outside its own subtree.
"""

from __future__ import annotations

import json
from urllib.parse import quote, unquote

# Keys reserved in every commit transaction besides the write set: the header compare,
# the tx-prefix delete, the outcome record and slack for locks (see engine.limits).
COMMIT_RESERVED_OPS = 8


def _q(text: str) -> str:
    return quote(text, safe="")


def encode_id(record_id: str | int | float) -> str:
    """A record id as stored: JSON keeps 7 and "7" apart."""
    return json.dumps(record_id, ensure_ascii=False)


class Keys:
    def __init__(self, prefix: str) -> None:
        prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""
        self.prefix = prefix

    def _k(self, *parts: str) -> bytes:
        return "/".join((self.prefix, *parts)).encode()

    # transactions
    def tx_prefix(self, tx_id: str) -> bytes:
        return self._k("tx", tx_id, "")

    def tx_header(self, tx_id: str) -> bytes:
        return self._k("tx", tx_id, "header")

    def tx_touch(self, tx_id: str) -> bytes:
        return self._k("tx", tx_id, "touch")

    def steps_prefix(self, tx_id: str) -> bytes:
        return self._k("tx", tx_id, "step", "")

    def step(self, tx_id: str, step_id: int) -> bytes:
        return self._k("tx", tx_id, "step", f"{step_id:010d}")

    def all_tx_prefix(self) -> bytes:
        return self._k("tx", "")

    # committed data
    def kv(self, key: str) -> bytes:
        return self._k("data", "kv", _q(key))

    def record(self, table: str, record_id: str | int | float) -> bytes:
        return self._k("data", "rec", table, _q(encode_id(record_id)))

    # locks, outbox, outcomes
    def fs_lock(self, root: str, path: str) -> bytes:
        # path first, so one prefix read finds a path's lock before the root is known
        return self._k("locks", "fs", _q(path), _q(root))

    def fs_lock_prefix(self, path: str) -> bytes:
        return self._k("locks", "fs", _q(path), "")

    def outbox(self, tx_id: str, seq: int) -> bytes:
        return self._k("outbox", tx_id, f"{seq:06d}")

    def outbox_prefix(self) -> bytes:
        return self._k("outbox", "")

    def outcome(self, tx_id: str) -> bytes:
        return self._k("outcomes", tx_id)

    # cluster
    def policies_prefix(self) -> bytes:
        return self._k("policies", "")

    def policy(self, namespace: str, name: str) -> bytes:
        return self._k("policies", namespace, name)

    def auth_jwks(self) -> bytes:
        """Service-account issuer keys, published by the operator (SPEC §9)."""
        return self._k("auth", "jwks")

    def replica(self, replica_id: str) -> bytes:
        return self._k("replicas", replica_id)

    def leader(self, role: str) -> bytes:
        return self._k("leader", role)


def tx_id_from_header_key(keys: Keys, key: bytes) -> str:
    rest = key[len(keys.all_tx_prefix()):].decode()
    return unquote(rest.split("/", 1)[0])
