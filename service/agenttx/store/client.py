"""The one gateway to etcd: connection, typed reads and compare-and-swap writes.

Why its own layer: aetcd 1.0 connects to a single host and drops the response header
of a Txn, but the engine needs (a) every configured endpoint so a cluster keeps
serving with a member down, (b) the revision a write produced, and (c) several keys
read at one revision in a single round trip. So we build the channel ourselves and
speak raw `etcdserverpb` Txn messages through aetcd's stubs — here and nowhere else:
callers build typed operations (`Put`, `Delete`, `Get`, `Compare`; the `op_*` / `cmp_*`
constructors) and get typed results (`KeyValue`, `TxnResult`), so the engine never sees
a protobuf message.

What it must never do: retry a compare-and-swap on its own. A timed-out CAS may or may
not have applied; the caller re-reads and decides (see engine/).
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

import aetcd
import grpc
from aetcd import rpc

from ..errors import StoreError, StoreUnavailable
from ..observability import tracing
from ..observability.context import count_round_trip, operation_label

# The typed operations live in store.ops; re-exported here for the operator and tests.
from .ops import (  # noqa: F401
    Compare,
    Delete,
    Get,
    KeyValue,
    Op,
    Put,
    TxnResult,
    WatchEvent,
    cmp_absent,
    cmp_create,
    cmp_exists,
    cmp_lease,
    cmp_mod,
    cmp_value,
    op_delete,
    op_delete_from,
    op_delete_prefix,
    op_get,
    op_get_prefix,
    op_put,
    prefix_end,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

# Large enough for a step record (1 MiB arguments + 1 MiB context + an undo image);
# matches the --max-request-bytes we give an embedded etcd (embedded_etcd).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# Keys per page when a prefix is read in pages
# (docs/architecture.md#every-answer-fits-cost-does-not-grow: never one unbounded range).
PAGE_SIZE = 256




# ---- typed <-> etcdserverpb ----------------------------------------------------------

_RESULTS = {"==": rpc.Compare.EQUAL, "!=": rpc.Compare.NOT_EQUAL, "<": rpc.Compare.LESS,
            ">": rpc.Compare.GREATER}


def _add_compare(req: Any, c: Compare) -> None:
    """Append `c` to `req.compare` in place. Filling the repeated field's own element is
    a third of the CPU of building each message by keyword and copying it in (upb: every
    nested constructor allocates a message that the outer one then copies); a step's CAS
    carries a dozen of them (docs/benchmarks.md, "Where a step's CPU goes")."""
    m = req.compare.add()
    m.key = c.key
    m.result = _RESULTS[c.relation]
    if c.target == "mod":
        m.target = rpc.Compare.MOD
        m.mod_revision = int(c.operand)
    elif c.target == "create":
        m.target = rpc.Compare.CREATE
        m.create_revision = int(c.operand)
    elif c.target == "lease":
        m.target = rpc.Compare.LEASE
        m.lease = int(c.operand)
    else:
        m.target = rpc.Compare.VALUE
        m.value = c.operand  # type: ignore[assignment]


def _add_op(ops: Any, op: Op) -> None:
    """Append `op` to a repeated RequestOp field in place (see `_add_compare`)."""
    if isinstance(op, Put):
        put = ops.add().request_put
        put.key = op.key
        put.value = op.value
        if op.lease:
            put.lease = op.lease
    elif isinstance(op, Delete):
        delete = ops.add().request_delete_range
        delete.key = op.key
        if op.range_end:
            delete.range_end = op.range_end
    else:
        get = ops.add().request_range
        get.key = op.key
        if op.range_end:
            get.range_end = op.range_end
        if op.limit:
            get.limit = op.limit


def txn_request(compare: Sequence[Compare], success: Sequence[Op],
                failure: Sequence[Op] = ()) -> Any:
    """The etcdserverpb TxnRequest of a plan."""
    req = rpc.TxnRequest()
    for c in compare:
        _add_compare(req, c)
    for o in success:
        _add_op(req.success, o)
    for o in failure:
        _add_op(req.failure, o)
    return req


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
        tls_server_name: str | None = None,
    ) -> None:
        super().__init__(timeout=timeout)  # type: ignore[arg-type]
        self.endpoints = list(endpoints)
        self.target = _target(self.endpoints)
        self._tls = (ca_file, cert_file, key_file)
        # The name TLS checks etcd's certificates against. An `ipv4:a,b` target names no
        # host, so without an override gRPC cannot verify any member: default to the
        # first endpoint's host (its certificate — or a shared one — must carry it).
        if tls_server_name is None and self.target.startswith("ipv4:") and len(self.endpoints) > 1:
            tls_server_name = _clean(self.endpoints[0]).rsplit(":", 1)[0]
        self._tls_server_name = tls_server_name

    async def connect(self) -> None:  # overrides aetcd's single-host connect
        if self._connected.is_set():
            return
        options: list[tuple[str, int | str]] = [
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
            if self._tls_server_name:
                options.append(("grpc.ssl_target_name_override", self._tls_server_name))
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


def translate(exc: BaseException, what: str) -> Exception:
    """An etcd client failure as a domain error (StoreUnavailable / StoreError)."""
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


class WatchStream:
    """One open etcd watch: iterate for `WatchEvent`s in revision order; `cancel()` ends
    it. A failure of the stream surfaces as StoreUnavailable / StoreError."""

    def __init__(self, watch: Any, what: str) -> None:
        self._watch = watch
        self._what = what

    async def __aiter__(self) -> AsyncIterator[WatchEvent]:
        try:
            async for event in self._watch:
                kv = event.kv
                deleted = str(event.kind).upper().endswith("DELETE")
                yield WatchEvent(bytes(kv.key), None if deleted else bytes(kv.value),
                                 int(kv.mod_revision))
        except Exception as exc:  # translated: callers see only domain errors
            raise translate(exc, self._what) from exc

    async def cancel(self) -> None:
        await self._watch.cancel()


class Store:
    """Typed reads and guarded writes over one EtcdClient.

    The client is private: nothing outside this package talks to etcd except through
    these methods (leases: `store.lease`; watches: `store.watch`)."""

    def __init__(self, client: EtcdClient, timeout: float = 5.0) -> None:
        self._etcd = client
        self.timeout = timeout

    @staticmethod
    async def _round_trip(what: str, call: Callable[..., Awaitable[T]], *args: Any,
                          failure: str | None = None, **kwargs: Any) -> T:
        """`call(*args, **kwargs)`, one etcd round trip: counted (with its latency) for the
        metrics whatever its outcome, and any failure translated into a domain error
        (`failure` names it; default `what`)."""
        started = time.perf_counter()
        try:
            return await call(*args, **kwargs)
        except Exception as exc:  # translated: callers see only domain errors
            raise translate(exc, failure or what) from exc
        finally:
            count_round_trip(what, time.perf_counter() - started)

    async def txn(self, compare: Sequence[Compare], success: Sequence[Op],
                  failure: Sequence[Op] = (), what: str = "write") -> TxnResult:
        """ONE guarded etcd transaction. Never retried here (see module docstring)."""
        await self._etcd.connect()
        req = txn_request(compare, success, failure)
        with tracing.etcd_span(operation_label(what)):
            resp = await self._round_trip(what, self._etcd.kvstub.Txn, req, timeout=self.timeout)
        results: list[list[KeyValue] | None] = []
        for r in resp.responses:
            if r.WhichOneof("response") == "response_range":
                results.append([_kv(m) for m in r.response_range.kvs])
            else:
                results.append(None)
        return TxnResult(bool(resp.succeeded), int(resp.header.revision), results)

    async def read(self, ops: Sequence[Get], what: str = "read") -> TxnResult:
        """Several keys and ranges at one revision: ONE etcd round trip."""
        return await self.txn([], ops, [], what)

    async def get(self, key: bytes, what: str = "read") -> KeyValue | None:
        return (await self.read([Get(key)], what)).first(0)

    async def get_many(self, keys: Iterable[bytes], what: str = "read"
                       ) -> dict[bytes, KeyValue | None]:
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}
        res = await self.read([Get(k) for k in wanted], what)
        return {k: res.first(i) for i, k in enumerate(wanted)}

    async def pages(self, prefix: bytes, *, start: bytes | None = None,
                    page_size: int = PAGE_SIZE, what: str = "read", keys_only: bool = False
                    ) -> AsyncIterator[list[KeyValue]]:
        """The keys of `prefix` (from `start` on) in pages of `page_size`, all read at the
        revision of the first page, so the pages form one consistent snapshot. With
        `keys_only` the values are not sent (each KeyValue's value is b"")."""
        end = prefix_end(prefix)
        key = start or prefix
        revision = 0
        await self._etcd.connect()
        while True:
            req = rpc.RangeRequest(key=key, range_end=end, limit=page_size, revision=revision,
                                   keys_only=keys_only)
            resp = await self._round_trip(what, self._etcd.kvstub.Range, req, timeout=self.timeout)
            if not revision:
                revision = int(resp.header.revision)
            kvs = [_kv(m) for m in resp.kvs]
            if kvs:
                yield kvs
            if not resp.more or not kvs:
                return
            key = kvs[-1].key + b"\x00"

    async def get_prefix(self, prefix: bytes, what: str = "read") -> list[KeyValue]:
        """Every key of `prefix`, read in pages (for bounded sets only)."""
        out: list[KeyValue] = []
        async for page in self.pages(prefix, what=what):
            out.extend(page)
        return out

    async def count(self, prefix: bytes, what: str = "read") -> int:
        await self._etcd.connect()
        req = rpc.RangeRequest(key=prefix, range_end=prefix_end(prefix), count_only=True)
        resp = await self._round_trip(what, self._etcd.kvstub.Range, req, timeout=self.timeout)
        return int(resp.count)

    async def put(self, key: bytes, value: bytes, lease: int = 0, what: str = "put") -> int:
        return (await self.txn([], [Put(key, value, lease)], what=what)).revision

    async def delete(self, key: bytes, what: str = "delete") -> None:
        await self.txn([], [Delete(key)], what=what)

    async def grant_lease(self, ttl_s: int, what: str = "lease") -> tuple[int, int]:
        """A new lease: (id, granted ttl)."""
        await self._etcd.connect()
        lease = await self._round_trip(what, self._etcd.lease, ttl_s, failure="lease grant")
        return int(lease.id), int(lease.ttl)

    async def refresh_lease(self, lease_id: int, *, timeout: float | None = None,
                            what: str = "lease") -> int:
        """One keepalive of a lease: the TTL etcd granted again, 0 when the lease has
        expired or was revoked. Raises StoreUnavailable / StoreError (also when no
        answer came within `timeout`, default the store's)."""
        await self._etcd.connect()
        reply = await self._round_trip(
            what, asyncio.wait_for, self._etcd.refresh_lease(lease_id),
            timeout=self.timeout if timeout is None else timeout, failure="lease refresh")
        return 0 if reply is None else max(0, int(reply.TTL))

    async def revoke_lease(self, lease_id: int, *, timeout: float | None = None,
                           what: str = "lease") -> None:
        """Revoke a lease, deleting every key attached to it. Raises StoreUnavailable /
        StoreError when etcd cannot be told (the lease then expires on its own)."""
        await self._etcd.connect()
        await self._round_trip(
            what, asyncio.wait_for, self._etcd.revoke_lease(lease_id),
            timeout=self.timeout if timeout is None else timeout, failure="lease revoke")

    async def watch(self, key: bytes, *, range_end: bytes | None = None,
                    start_revision: int, what: str = "watch") -> WatchStream:
        """Open a watch of `key` (or [key, range_end)) from `start_revision`, inclusive.
        Raises StoreUnavailable / StoreError when it cannot be created (RevisionCompacted
        included: the caller reloads). Use `agenttx.store.watch.Watch`, which keeps a
        view current across interruptions, rather than this."""
        await self._etcd.connect()
        watch = await self._round_trip(what, self._etcd.watch, key, range_end=range_end,
                                       start_revision=start_revision)
        return WatchStream(watch, what)

    async def ping(self, timeout: float) -> None:
        """One cheap round trip (a 1-key range), for readiness; raises StoreUnavailable."""
        await self._etcd.connect()
        try:
            await self._etcd.kvstub.Range(rpc.RangeRequest(key=b"\x00", limit=1),
                                           timeout=timeout)
        except Exception as exc:
            raise translate(exc, "health check") from exc

    async def close(self) -> None:
        await self._etcd.close()


def connect(endpoints: Sequence[str], *, timeout: float = 5.0, ca_file: str | None = None,
            cert_file: str | None = None, key_file: str | None = None,
            tls_server_name: str | None = None) -> Store:
    return Store(EtcdClient(endpoints, timeout=timeout, ca_file=ca_file, cert_file=cert_file,
                            key_file=key_file, tls_server_name=tls_server_name),
                 timeout=timeout)
