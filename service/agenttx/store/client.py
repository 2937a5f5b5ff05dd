"""The one gateway to etcd: connection, batched reads and compare-and-swap writes.

Why its own layer: aetcd 1.0 connects to a single host and drops the response header
of a Txn, but the engine needs (a) every configured endpoint so a cluster keeps
serving with a member down, (b) the revision a write produced, and (c) several keys
read at one revision in a single round trip. So we build the channel ourselves and
speak raw `etcdserverpb` Txn messages through aetcd's stubs.

What it must never do: retry a compare-and-swap on its own. A timed-out CAS may or may
not have applied; the caller re-reads and decides (see engine.transactions).
"""

from __future__ import annotations

import contextvars
import logging
import pathlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import aetcd
import grpc
from aetcd import rpc

from ..errors import StoreError, StoreUnavailable

log = logging.getLogger(__name__)

# Counts etcd round trips made on behalf of the current RPC (set by api.servicer), so the
# per-RPC budget documented in engine/transactions.py is observable in the access log.
ROUND_TRIPS: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "agenttx_etcd_round_trips", default=None)

# Large enough for a step record (1 MiB arguments + 1 MiB context + an undo image);
# matches the --max-request-bytes we give an embedded etcd (store.embedded).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def prefix_end(prefix: bytes) -> bytes:
    return aetcd.utils.prefix_range_end(prefix)


@dataclass(frozen=True)
class KeyValue:
    key: bytes
    value: bytes
    mod_revision: int
    create_revision: int
    lease: int


@dataclass(frozen=True)
class ReadResult:
    """Keys read in one round trip at one revision."""

    revision: int
    single: dict[bytes, KeyValue | None]
    ranges: dict[bytes, list[KeyValue]]

    def mod_revision(self, key: bytes) -> int:
        kv = self.single.get(key)
        return kv.mod_revision if kv else 0


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int
    responses: list[Any]


# ---- operations (thin constructors over etcdserverpb messages) ---------------------

def op_put(key: bytes, value: bytes, lease: int = 0) -> Any:
    return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease))


def op_delete(key: bytes) -> Any:
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key))


def op_delete_prefix(prefix: bytes) -> Any:
    return rpc.RequestOp(
        request_delete_range=rpc.DeleteRangeRequest(key=prefix, range_end=prefix_end(prefix))
    )


def op_get(key: bytes) -> Any:
    return rpc.RequestOp(request_range=rpc.RangeRequest(key=key))


def op_get_prefix(prefix: bytes) -> Any:
    return rpc.RequestOp(request_range=rpc.RangeRequest(key=prefix, range_end=prefix_end(prefix)))


def cmp_mod(key: bytes, mod_revision: int) -> Any:
    """key's mod_revision == mod_revision (0 means: the key is absent)."""
    return rpc.Compare(
        key=key, result=rpc.Compare.EQUAL, target=rpc.Compare.MOD, mod_revision=mod_revision
    )


def cmp_value(key: bytes, value: bytes) -> Any:
    return rpc.Compare(key=key, result=rpc.Compare.EQUAL, target=rpc.Compare.VALUE, value=value)


def cmp_absent(key: bytes) -> Any:
    return rpc.Compare(
        key=key, result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE, create_revision=0
    )


def _kv(m: Any) -> KeyValue:
    return KeyValue(
        key=bytes(m.key), value=bytes(m.value), mod_revision=int(m.mod_revision),
        create_revision=int(m.create_revision), lease=int(m.lease),
    )


def _clean(endpoint: str) -> str:
    return endpoint.split("://", 1)[-1].rstrip("/")


def _target(endpoints: Sequence[str]) -> str:
    """The gRPC target. IP literals go into ONE `ipv4:a:p,b:p` target: the channel itself
    fails over between them. gRPC's target syntax cannot list several DNS names, so for
    names only the first is used: give IP addresses, or one name that resolves to every
    member (a Kubernetes Service), when failover matters. (Switching channels between
    names on failure was tried and removed: under member loss it could leave the
    server's own gRPC loop unresponsive.)"""
    cleaned = [_clean(e) for e in endpoints]
    if all(_is_ipv4(c.rsplit(":", 1)[0]) for c in cleaned):
        return "ipv4:" + ",".join(cleaned)
    return f"dns:///{cleaned[0]}"


def _is_ipv4(host: str) -> bool:
    parts = host.split(".")
    return len(parts) == 4 and all(p.isdigit() and 0 <= int(p) <= 255 for p in parts)


class EtcdClient(aetcd.Client):
    """aetcd.Client with a multi-endpoint channel, optional TLS and big messages."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        timeout: float = 5.0,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
    ) -> None:
        super().__init__(timeout=timeout)  # type: ignore[arg-type]
        self.endpoints = list(endpoints)
        self.target = _target(self.endpoints)
        self._tls = (ca_file, cert_file, key_file)

    async def connect(self) -> None:  # overrides aetcd's single-host connect
        if self._connected.is_set():
            return
        options = [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.keepalive_time_ms", 10_000),
            ("grpc.keepalive_timeout_ms", 5_000),
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", 2_000),
        ]
        target = self.target
        ca, cert, key = self._tls
        if ca or cert:
            creds = grpc.ssl_channel_credentials(
                root_certificates=pathlib.Path(ca).read_bytes() if ca else None,
                private_key=pathlib.Path(key).read_bytes() if key else None,
                certificate_chain=pathlib.Path(cert).read_bytes() if cert else None,
            )
            self.channel = grpc.aio.secure_channel(target, creds, options=options)
        else:
            self.channel = grpc.aio.insecure_channel(target, options=options)
        self.kvstub = rpc.KVStub(self.channel)
        self.clusterstub = rpc.ClusterStub(self.channel)
        self.leasestub = rpc.LeaseStub(self.channel)
        self.maintenancestub = rpc.MaintenanceStub(self.channel)
        self._watcher = aetcd.watcher.Watcher(
            rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
        )
        self._connected.set()


def _translate(exc: BaseException, what: str) -> Exception:
    if isinstance(exc, grpc.aio.AioRpcError):
        code = exc.code()
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return StoreUnavailable(f"etcd unreachable during {what}: {code.name}")
        return StoreError(f"etcd {what} failed: {code.name}: {exc.details()}")
    if isinstance(exc, aetcd.exceptions.ConnectionFailedError | aetcd.exceptions.ConnectionTimeoutError):
        return StoreUnavailable(f"etcd unreachable during {what}")
    if isinstance(exc, TimeoutError):
        return StoreUnavailable(f"etcd timed out during {what}")
    return StoreError(f"etcd {what} failed: {type(exc).__name__}")


class Store:
    """Batched reads and guarded writes over one EtcdClient."""

    def __init__(self, client: EtcdClient, timeout: float = 5.0) -> None:
        self.client = client
        self.timeout = timeout

    async def _txn(self, compare: list[Any], success: list[Any], failure: list[Any],
                   what: str) -> TxnResult:
        await self.client.connect()
        counter = ROUND_TRIPS.get()
        if counter is not None:
            counter[0] += 1
        req = rpc.TxnRequest(compare=compare, success=success, failure=failure)
        try:
            resp = await self.client.kvstub.Txn(req, timeout=self.timeout)
        except Exception as exc:  # translated: callers see only domain errors
            raise _translate(exc, what) from exc
        return TxnResult(bool(resp.succeeded), int(resp.header.revision), list(resp.responses))

    async def read(self, keys: Iterable[bytes] = (), prefixes: Iterable[bytes] = (),
                   what: str = "read") -> ReadResult:
        """Read keys and prefixes at one revision: ONE etcd round trip."""
        keys = list(dict.fromkeys(keys))
        prefixes = list(dict.fromkeys(prefixes))
        ops = [op_get(k) for k in keys] + [op_get_prefix(p) for p in prefixes]
        res = await self._txn([], ops, [], what)
        single: dict[bytes, KeyValue | None] = {}
        ranges: dict[bytes, list[KeyValue]] = {}
        for i, r in enumerate(res.responses):
            kvs = [_kv(m) for m in r.response_range.kvs]
            if i < len(keys):
                single[keys[i]] = kvs[0] if kvs else None
            else:
                ranges[prefixes[i - len(keys)]] = kvs
        return ReadResult(res.revision, single, ranges)

    async def txn(self, compare: list[Any], success: list[Any], failure: list[Any] | None = None,
                  what: str = "write") -> TxnResult:
        """ONE guarded etcd transaction. Never retried here (see module docstring)."""
        return await self._txn(compare, success, failure or [], what)

    async def get(self, key: bytes) -> KeyValue | None:
        return (await self.read([key])).single[key]

    async def get_prefix(self, prefix: bytes) -> list[KeyValue]:
        return (await self.read(prefixes=[prefix])).ranges[prefix]

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        return (await self.txn([], [op_put(key, value, lease)], what="put")).revision

    async def delete(self, key: bytes) -> None:
        await self.txn([], [op_delete(key)], what="delete")

    async def close(self) -> None:
        await self.client.close()


def connect(endpoints: Sequence[str], *, timeout: float = 5.0, ca_file: str | None = None,
            cert_file: str | None = None, key_file: str | None = None) -> Store:
    return Store(EtcdClient(endpoints, timeout=timeout, ca_file=ca_file, cert_file=cert_file,
                            key_file=key_file), timeout=timeout)
