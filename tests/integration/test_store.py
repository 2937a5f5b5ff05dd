"""The etcd gateway against a real etcd: batched reads and compare-and-swap."""

from agenttx.store.client import cmp_mod, connect, op_put


async def test_read_batches_keys_at_one_revision_and_cas_guards_writes(etcd_endpoint, etcd_prefix):
    store = connect([etcd_endpoint])
    try:
        a, b = f"{etcd_prefix}/a".encode(), f"{etcd_prefix}/b".encode()
        rev = await store.put(a, b"1")
        got = await store.read([a, b], [etcd_prefix.encode() + b"/"])
        assert got.single[a] is not None and got.single[a].value == b"1"
        assert got.single[b] is None
        assert got.mod_revision(a) == rev and got.mod_revision(b) == 0
        assert [kv.key for kv in got.ranges[etcd_prefix.encode() + b"/"]] == [a]

        ok = await store.txn([cmp_mod(a, rev)], [op_put(a, b"2")])
        assert ok.succeeded and ok.revision > rev
        stale = await store.txn([cmp_mod(a, rev)], [op_put(a, b"3")])
        assert not stale.succeeded
        assert (await store.get(a)).value == b"2"
    finally:
        await store.close()
