"""The etcd gateway against a real etcd: typed reads at one revision, compare-and-swap,
bounded pages, and what a lost compare's failure branch returns."""

from agenttx.store.client import (
    Get,
    cmp_absent,
    cmp_exists,
    cmp_mod,
    connect,
    op_delete_from,
    op_get,
    op_get_prefix,
    op_put,
)


async def test_read_batches_keys_at_one_revision_and_cas_guards_writes(etcd_endpoint, etcd_prefix):
    store = connect([etcd_endpoint])
    try:
        a, b = f"{etcd_prefix}/a".encode(), f"{etcd_prefix}/b".encode()
        rev = await store.put(a, b"1")
        got = await store.read([op_get(a), op_get(b), op_get_prefix(etcd_prefix.encode() + b"/")])
        assert got.first(0) is not None and got.first(0).value == b"1"
        assert got.first(0).mod_revision == rev
        assert got.first(1) is None
        assert [kv.key for kv in got.kvs(2)] == [a]

        ok = await store.txn([cmp_mod(a, rev)], [op_put(a, b"2")])
        assert ok.succeeded and ok.revision > rev
        stale = await store.txn([cmp_mod(a, rev), cmp_absent(b)], [op_put(a, b"3")],
                                [op_get(a), op_get(b)])
        assert not stale.succeeded
        # the failure branch tells what is really there
        assert stale.first(0).value == b"2" and stale.first(1) is None
        assert (await store.get(a)).value == b"2"
        assert (await store.txn([cmp_exists(a)], [])).succeeded
        assert not (await store.txn([cmp_exists(b)], [])).succeeded
    finally:
        await store.close()


async def test_pages_read_a_prefix_in_bounded_pages_at_one_revision(etcd_endpoint, etcd_prefix):
    store = connect([etcd_endpoint])
    try:
        prefix = f"{etcd_prefix}/p/".encode()
        for i in range(25):
            await store.put(prefix + b"%03d" % i, b"x")
        pages = [page async for page in store.pages(prefix, page_size=10)]
        assert [len(p) for p in pages] == [10, 10, 5]
        assert [kv.key for p in pages for kv in p] == [prefix + b"%03d" % i for i in range(25)]
        assert await store.count(prefix) == 25
        # a range delete from a start key (how a rollback drops steps >= j)
        await store.txn([], [op_delete_from(prefix + b"020", prefix)])
        assert await store.count(prefix) == 20
        assert [kv.key for kv in await store.get_prefix(prefix)][-1] == prefix + b"019"
        assert (await store.read([Get(prefix + b"000")])).first(0) is not None
    finally:
        await store.close()
