"""The etcd key layout. Every key the service and the operator write is built here.

    <prefix>/txh/<id>                 transaction header (the CAS anchor): status, policy,
                                      counters and budgets; small and of constant size
    <prefix>/tx/<id>/step/<n:010d>    one record per live step: output, undo images
    <prefix>/tx/<id>/ctx/<n:010d>     the step's raw_context (read only by GetTransaction)
    <prefix>/tx/<id>/key/<data id>    one entry per data key the transaction touched:
                                      observed revision (the read set) + buffered write
    <prefix>/tx/<id>/fx/<n:010d>/<i>  effects staged by live step n
    <prefix>/tx/<id>/gate/<n:010d>/<i>  what live step n will do that needs approval
                                      (a gated effect or call; docs/approvals.md)
    <prefix>/tx/<id>/meta             BeginTransaction.metadata (audit)
    <prefix>/tx/<id>/intent           a toolset saga call in flight (docs/toolsets.md)
    <prefix>/touch/<id>               last read-only activity (GetTransaction), for the reaper
    <prefix>/approvals/<id>           a pending approval: what ListApprovals shows (written
                                      with AWAITING_APPROVAL, deleted when it is decided)
    <prefix>/hist/<id>/h              how an ended transaction ended (GetTransactionHistory)
    <prefix>/hist/<id>/s/<seq:010d>   one entry per step sent, failed attempts included
    <prefix>/open/<principal>/<slot>  one of the principal's --max-open-transactions slots
    <prefix>/data/kv/<key>            committed kv values
    <prefix>/data/rec/<table>/<id>    committed record rows (id JSON-encoded: 7 != "7")
    <prefix>/locks/fs/<real path>     fs lock on a resolved file path: value = holding tx id
    <prefix>/effkeys/<owner>/<key>    idempotency keys staged, committed or delivered
    <prefix>/outbox/<id>/<seq:06d>    committed, not yet delivered effects and deferred calls
    <prefix>/deadletters/<owner>/<key> deliveries refused permanently (docs/operations.md)
    <prefix>/policies/<ns>/<name>     published AgentTxPolicy (written by the operator)
    <prefix>/toolsets/<ns>/<name>     published AgentTxToolset (written by the operator)
    <prefix>/auth/jwks                service-account issuer keys (written by the operator)
    <prefix>/replicas/<replica-id>    liveness of a service replica (leased)
    <prefix>/leader/<role>            leader election (dispatcher, reaper)

Why history lives apart from the transaction: `tx/<id>/` is deleted when the transaction
ends, while its history stays for --history-retention-s on shared leases; one small key
per step sent (never one growing document), so recording a step costs the same at step 1
and step 500 (docs/client.md, "History").

Why headers live apart from the rest of a transaction: the idle reaper and
ListTransactions page through headers only, so their cost never depends on how much
data open transactions hold (docs/architecture.md, "Every answer fits").

Several deployments can share one etcd by using different prefixes. Variable parts are
percent-encoded so that no user-supplied key can reach outside its own subtree.
"""

from __future__ import annotations

import json
import re
from urllib.parse import quote, unquote

# Operations reserved in every commit transaction besides the write set: the header
# compare and delete, the transaction-prefix delete, the touch key and slack.
COMMIT_RESERVED_OPS = 8


# `<owner>/<key>`, each percent-encoded by `_q` (unreserved characters and %XX only).
_TOKEN = re.compile(r"[A-Za-z0-9_.~%-]+/[A-Za-z0-9_.~%-]+")


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
    def tx_header(self, tx_id: str) -> bytes:
        return self._k("txh", tx_id)

    def headers_prefix(self) -> bytes:
        return self._k("txh", "")

    def tx_prefix(self, tx_id: str) -> bytes:
        return self._k("tx", tx_id, "")

    def tx_meta(self, tx_id: str) -> bytes:
        return self._k("tx", tx_id, "meta")

    def saga_intent(self, tx_id: str) -> bytes:
        """What a toolset saga call in flight is doing (arguments, idempotency key,
        compensation), valid while the header's `SagaPending` names its step."""
        return self._k("tx", tx_id, "intent")

    def tx_touch(self, tx_id: str) -> bytes:
        return self._k("touch", tx_id)

    def touch_prefix(self) -> bytes:
        return self._k("touch", "")

    def open_slot(self, principal: str, slot: int) -> bytes:
        """One open-transaction slot of a principal (SPEC §9 quotas): a transaction takes a
        free slot at begin and frees it when it ends, so the count is exact across
        replicas without a shared counter."""
        return self._k("open", _q(principal or "-"), f"{slot:06d}")

    def open_prefix(self, principal: str) -> bytes:
        return self._k("open", _q(principal or "-"), "")

    def slot_of(self, principal: str, key: bytes) -> int:
        """The slot number of one of `principal`'s `open_slot` keys."""
        return int(_tail(self.open_prefix(principal), key))

    def steps_prefix(self, tx_id: str) -> bytes:
        return self._k("tx", tx_id, "step", "")

    def step(self, tx_id: str, step_id: int) -> bytes:
        return self._k("tx", tx_id, "step", f"{step_id:010d}")

    def context_prefix(self, tx_id: str) -> bytes:
        return self._k("tx", tx_id, "ctx", "")

    def context(self, tx_id: str, step_id: int) -> bytes:
        return self._k("tx", tx_id, "ctx", f"{step_id:010d}")

    def step_of_context(self, tx_id: str, key: bytes) -> int:
        """The step id of one of the transaction's `context` keys."""
        return int(_tail(self.context_prefix(tx_id), key))

    def touched_prefix(self, tx_id: str) -> bytes:
        return self._k("tx", tx_id, "key", "")

    def touched(self, tx_id: str, data_key: bytes) -> bytes:
        """The transaction's entry for a committed data key, or for an fs pseudo-key
        (`fs_id`): the data key is stored relative to the prefix."""
        text = data_key.decode()
        head = self.prefix + "/"
        if text.startswith(head):
            text = text[len(head):]
        return self._k("tx", tx_id, "key", _q(text))

    def data_key_of_touched(self, tx_id: str, touched_key: bytes) -> bytes:
        rel = unquote(_tail(self.touched_prefix(tx_id), touched_key).decode())
        return rel.encode() if rel.startswith("fs:") else self._k(rel)

    def effects_prefix(self, tx_id: str) -> bytes:
        return self._k("tx", tx_id, "fx", "")

    def effect(self, tx_id: str, step_id: int, index: int) -> bytes:
        return self._k("tx", tx_id, "fx", f"{step_id:010d}", f"{index:04d}")

    def step_of_effect(self, tx_id: str, key: bytes) -> int:
        """The step id that staged one of the transaction's `effect` keys."""
        return int(_tail(self.effects_prefix(tx_id), key).split(b"/", 1)[0])
    def gates_prefix(self, tx_id: str) -> bytes:
        return self._k("tx", tx_id, "gate", "")

    def gate(self, tx_id: str, step_id: int, index: int = 0) -> bytes:
        """What live step `step_id` will do that needs approval (its `index`-th gated
        effect, or its gated call): `engine.state.GatedCall`."""
        return self._k("tx", tx_id, "gate", f"{step_id:010d}", f"{index:04d}")

    # approvals (ListApprovals, DecideApproval)
    def approval(self, tx_id: str) -> bytes:
        """The pending approval of a transaction in AWAITING_APPROVAL: written by the
        commit that asked for it, deleted by whatever ends the wait, so ListApprovals
        pages through pending approvals only, never through every transaction."""
        return self._k("approvals", tx_id)

    def approvals_prefix(self) -> bytes:
        return self._k("approvals", "")

    # history (GetTransactionHistory)
    def history_end(self, tx_id: str) -> bytes:
        """How an ended transaction ended; written by the etcd transaction that ends it."""
        return self._k("hist", tx_id, "h")

    def history_steps_prefix(self, tx_id: str) -> bytes:
        return self._k("hist", tx_id, "s", "")

    def history_step(self, tx_id: str, seq: int) -> bytes:
        """The `seq`-th step sent to the transaction (a step id repeats when it failed
        and was retried; `seq` never does)."""
        return self._k("hist", tx_id, "s", f"{seq:010d}")

    # committed data
    def kv(self, key: str) -> bytes:
        return self._k("data", "kv", _q(key))

    def record(self, table: str, record_id: str | int | float) -> bytes:
        return self._k("data", "rec", table, _q(encode_id(record_id)))

    def data_prefix(self) -> bytes:
        return self._k("data", "")

    # locks, idempotency keys, outbox
    def fs_lock(self, real_path: str) -> bytes:
        """The lock of one file, named by its resolved absolute path (symlinks and `.`
        followed), so two spellings of one file are one lock (SPEC §3)."""
        return self._k("locks", "fs", _q(real_path))

    def fs_locks_prefix(self) -> bytes:
        return self._k("locks", "fs", "")

    def effect_key(self, owner: str, idempotency_key: str) -> bytes:
        """Reservation of an idempotency key; `owner` is the principal ("" without
        authentication: one namespace per deployment)."""
        return self._k("effkeys", _q(owner or "-"), _q(idempotency_key))

    def effect_keys_prefix(self) -> bytes:
        return self._k("effkeys", "")

    def outbox(self, tx_id: str, seq: int) -> bytes:
        return self._k("outbox", tx_id, f"{seq:06d}")

    def outbox_prefix(self) -> bytes:
        return self._k("outbox", "")

    def dead_letter(self, owner: str, idempotency_key: str) -> bytes:
        """A delivery its receiver refused permanently, by its idempotency key (unique
        per owner, like `effect_key`)."""
        return self._k("deadletters", _q(owner or "-"), _q(idempotency_key))

    def dead_letters_prefix(self) -> bytes:
        return self._k("deadletters", "")

    def dead_letter_parts(self, key: bytes) -> tuple[str, str]:
        """(owner, idempotency key) of a dead letter's etcd key (owner "" without
        authentication)."""
        owner, _, idem = key[len(self.dead_letters_prefix()):].decode().partition("/")
        return ("" if owner == "-" else unquote(owner)), unquote(idem)

    def dead_letter_token(self, key: bytes) -> str:
        """A dead letter's place in the listing, as ListDeadLetters' page token: its key
        below the dead letters' prefix (percent-encoded parts, so printable ASCII)."""
        return key[len(self.dead_letters_prefix()):].decode()

    def dead_letters_after(self, token: str) -> bytes:
        """Where the page after `token` starts. ValueError for a token this layout never
        produced."""
        if not _TOKEN.fullmatch(token):
            raise ValueError("not a dead letter page token")
        return self.dead_letters_prefix() + token.encode() + b"\x00"


    # cluster
    def policies_prefix(self) -> bytes:
        return self._k("policies", "")

    def policy(self, namespace: str, name: str) -> bytes:
        return self._k("policies", namespace, name)

    def policy_of(self, key: bytes) -> tuple[str, str] | None:
        """(namespace, name) of a key under `policies_prefix`; None for any other key."""
        return _namespaced(self.policies_prefix(), key)

    def toolsets_prefix(self) -> bytes:
        return self._k("toolsets", "")

    def toolset(self, namespace: str, name: str) -> bytes:
        return self._k("toolsets", namespace, name)

    def toolset_of(self, key: bytes) -> tuple[str, str] | None:
        """(namespace, name) of a key under `toolsets_prefix`; None for any other key."""
        return _namespaced(self.toolsets_prefix(), key)

    def auth_jwks(self) -> bytes:
        return self._k("auth", "jwks")

    def replica(self, replica_id: str) -> bytes:
        return self._k("replicas", replica_id)

    def leader(self, role: str) -> bytes:
        return self._k("leader", role)


def _tail(prefix: bytes, key: bytes) -> bytes:
    """What follows `prefix` in `key`; ValueError when `key` is not under it."""
    if not key.startswith(prefix):
        raise ValueError(f"{key!r} is not under {prefix!r}")
    return key[len(prefix):]


def _namespaced(prefix: bytes, key: bytes) -> tuple[str, str] | None:
    """`<prefix><ns>/<name>` as (ns, name), name being whatever follows the namespace
    (a key written by hand may have no name, or more segments); None when `key` is not
    under `prefix`."""
    if not key.startswith(prefix):
        return None
    namespace, _, name = key[len(prefix):].decode("utf-8", "replace").partition("/")
    return namespace, name


def fs_id(rel_path: str) -> bytes:
    """The pseudo data key of a sandbox file (relative to its resolved root): fs.write
    keeps one touched entry per file, for provenance and its lock."""
    return f"fs:{rel_path}".encode()


def tx_id_from_header_key(keys: Keys, key: bytes) -> str:
    return unquote(_tail(keys.headers_prefix(), key).decode())


def describe_data_key(keys: Keys, key: bytes) -> str:
    """A committed data key as a person reads it: `kv key "cart"`, `row id=7 in table "t"`."""
    text = key.decode()[len(keys.prefix):]
    parts = text.strip("/").split("/")
    if parts[:2] == ["data", "kv"] and len(parts) == 3:
        return f'kv key "{unquote(parts[2])}"'
    if parts[:2] == ["data", "rec"] and len(parts) == 4:
        return f'row id={unquote(parts[3])} in table "{parts[2]}"'
    return text


def data_id(keys: Keys, key: bytes) -> str:
    """A committed data key as the engine names data (provenance, approvals' write keys):
    `kv:<key>` or `rec:<table>:<id as JSON>` (`rec:orders:7`, `rec:orders:"7"`)."""
    text = key.decode()[len(keys.prefix):]
    parts = text.strip("/").split("/")
    if parts[:2] == ["data", "kv"] and len(parts) == 3:
        return f"kv:{unquote(parts[2])}"
    if parts[:2] == ["data", "rec"] and len(parts) == 4:
        return f"rec:{parts[2]}:{unquote(parts[3])}"
    return text
