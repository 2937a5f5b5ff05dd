"""The etcd TxnRequest a plan becomes (store/client.py `txn_request`): built in place for
speed, it must be the very message the keyword-built form was, byte for byte — above all
the compares against revision 0 ("absent"), whose oneof must be set even though 0 is the
default value, or etcd would compare against nothing."""

from __future__ import annotations

from aetcd import rpc

from agenttx.store.client import txn_request
from agenttx.store.ops import (
    Delete,
    Get,
    Put,
    cmp_absent,
    cmp_create,
    cmp_exists,
    cmp_lease,
    cmp_mod,
    cmp_value,
)


def test_a_plan_becomes_the_same_txn_request_as_built_message_by_message():
    compares = [cmp_mod(b"a", 0), cmp_mod(b"b", 7), cmp_value(b"c", b"v"), cmp_value(b"d", b""),
                cmp_absent(b"e"), cmp_exists(b"f"), cmp_create(b"g", 3), cmp_lease(b"h", 0),
                cmp_lease(b"i", 9)]
    ops = [Put(b"k", b"v"), Put(b"k", b""), Put(b"k", b"v", lease=5), Delete(b"x"),
           Delete(b"x", b"y"), Get(b"g"), Get(b"g", b"h", 3)]
    expected = rpc.TxnRequest(
        compare=[
            rpc.Compare(key=b"a", result=rpc.Compare.EQUAL, target=rpc.Compare.MOD,
                        mod_revision=0),
            rpc.Compare(key=b"b", result=rpc.Compare.EQUAL, target=rpc.Compare.MOD,
                        mod_revision=7),
            rpc.Compare(key=b"c", result=rpc.Compare.EQUAL, target=rpc.Compare.VALUE,
                        value=b"v"),
            rpc.Compare(key=b"d", result=rpc.Compare.EQUAL, target=rpc.Compare.VALUE,
                        value=b""),
            rpc.Compare(key=b"e", result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE,
                        create_revision=0),
            rpc.Compare(key=b"f", result=rpc.Compare.GREATER, target=rpc.Compare.CREATE,
                        create_revision=0),
            rpc.Compare(key=b"g", result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE,
                        create_revision=3),
            rpc.Compare(key=b"h", result=rpc.Compare.EQUAL, target=rpc.Compare.LEASE, lease=0),
            rpc.Compare(key=b"i", result=rpc.Compare.EQUAL, target=rpc.Compare.LEASE, lease=9),
        ],
        success=[
            rpc.RequestOp(request_put=rpc.PutRequest(key=b"k", value=b"v")),
            rpc.RequestOp(request_put=rpc.PutRequest(key=b"k", value=b"")),
            rpc.RequestOp(request_put=rpc.PutRequest(key=b"k", value=b"v", lease=5)),
            rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=b"x")),
            rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=b"x", range_end=b"y")),
            rpc.RequestOp(request_range=rpc.RangeRequest(key=b"g")),
            rpc.RequestOp(request_range=rpc.RangeRequest(key=b"g", range_end=b"h", limit=3)),
        ],
        failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=b"g"))])
    built = txn_request(compares, ops, [Get(b"g")])
    assert built.SerializeToString() == expected.SerializeToString()
    assert [c.WhichOneof("target_union") for c in built.compare] == [
        "mod_revision", "mod_revision", "value", "value", "create_revision", "create_revision",
        "create_revision", "lease", "lease"]
