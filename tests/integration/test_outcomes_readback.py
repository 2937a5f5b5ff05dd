"""The outcomes benchmark as a user of AgentTx: the baselines' own tools answer like the
built-ins wherever the oracle looks, AgentTx's state is read back through its client
(committed data only, nothing left open), and AgentTx's effects settle on what the
webhook receiver confirmed. Real etcd, two real replicas, a real receiver."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from agenttx.client import Policy, Strategy
from agenttx_bench.outcomes import oracle
from agenttx_bench.outcomes.direct import ToolFailure
from agenttx_bench.outcomes.dump import READ_AGENT, Items, read_agenttx
from agenttx_bench.outcomes.inject import Injector
from agenttx_bench.outcomes.plan import encode
from agenttx_bench.outcomes.receiver import Receiver
from agenttx_bench.outcomes.runner import Bench
from agenttx_bench.outcomes.state import canonical, strip_namespace
from support.waiting import slack

MOVE = 2  # move-00


@pytest.fixture(scope="module")
def bench() -> Iterator[Bench]:
    with Bench() as b:
        yield b


def _script(ns: str) -> list[tuple[str, dict[str, Any]]]:
    """Every outcome the oracle can see, in an order where no AgentTx rollback undoes an
    earlier step (no failure has a culprit; the failures in a row stay below the depth)."""
    return [
        ("kv.put", {"key": f"{ns}a", "value": {"n": 1}}),
        ("kv.get", {"key": f"{ns}a"}),
        ("kv.get", {"key": f"{ns}never"}),
        ("kv.delete", {"key": f"{ns}never"}),
        ("kv.put", {"key": f"{ns}gone", "value": 2}),
        ("kv.delete", {"key": f"{ns}gone"}),
        ("record.insert", {"table": "customers", "id": f"{ns}c1", "fields": {"name": "Ada"}}),
        ("record.insert", {"table": "customers", "id": f"{ns}c1", "fields": {}}),
        ("record.insert", {"table": "orders", "id": f"{ns}o1", "fields": {},
                           "references": {"customer_id": "customers"}}),
        ("record.insert", {"table": "orders", "id": f"{ns}o1",
                           "fields": {"customer_id": f"{ns}c2"},
                           "references": {"customer_id": "customers"}}),
        ("record.insert", {"table": "orders", "id": f"{ns}o1",
                           "fields": {"customer_id": f"{ns}c1", "total": 7.5},
                           "references": {"customer_id": "customers"}}),
        ("record.insert", {"table": "orders", "id": 7, "fields": {"n": "number id"}}),
        ("record.get", {"table": "orders", "id": f"{ns}o1"}),
        ("record.get", {"table": "orders", "id": "7"}),
        ("record.get", {"table": "orders", "id": 7}),
        ("record.get", {"table": "bad-name", "id": 1}),
        ("fs.write", {"path": f"{ns}docs/a.txt", "contents": "héllo\n"}),
        ("fs.read", {"path": f"{ns}docs/a.txt"}),
        ("fs.read", {"path": f"{ns}docs/none.txt"}),
        ("fs.write", {"path": "../escape.txt", "contents": "x"}),
        ("fs.write", {"path": "/tmp/escape.txt", "contents": "x"}),
        ("effect.stage", {"channel": "sms", "payload": {}}),
        ("effect.stage", {"channel": "webhook", "payload": {"order": f"{ns}o1"},
                          "idempotency_key": f"{ns}fx"}),
        ("kv.get", {"kye": f"{ns}a"}),
        ("kv.get", '{"key": "' + ns + 'a"'),
        ("fs.write", {"path": f"{ns}docs/b.txt"}),
    ]


def _text(args: dict[str, Any] | str) -> str:
    return args if isinstance(args, str) else encode(args)


def test_the_baselines_tools_answer_every_call_as_the_builtins_do(bench):
    """Same call, same outcome: success with the same output, or a failure; and the same
    state left behind (kv, rows with their id's JSON type, files, the delivered effect)."""
    ns_a, ns_d = f"a{uuid.uuid4().hex[:8]}/", f"d{uuid.uuid4().hex[:8]}/"
    agenttx: list[tuple[bool, Any]] = []
    client = bench.agenttx_agent.client
    tx = client.begin(agent_id="outcomes/test", policy=Policy(max_local_depth=16))
    for tool, args in _script(ns_a):
        r = tx.step(tool, _text(args))
        assert r.strategy in (Strategy.NONE, Strategy.LOCAL_BACKTRACK), (tool, args, r.hint)
        agenttx.append((r.ok, r.output if r.ok else r.category))
    assert tx.commit().committed
    baseline: list[tuple[bool, Any]] = []
    for tool, args in _script(ns_d):
        try:
            baseline.append((True, bench.run(bench.direct.call(tool, _text(args)))))
        except ToolFailure as exc:
            baseline.append((False, str(exc)))
    assert len(agenttx) == len(baseline) == len(_script(""))
    for (tool, _), (a_ok, a_out), (d_ok, d_out) in zip(_script(""), agenttx, baseline, strict=True):
        assert a_ok == d_ok, (tool, a_out, d_out)
        if a_ok:
            assert strip_namespace(a_out, ns_a) == strip_namespace(d_out, ns_d), tool
    assert [ok for ok, _ in agenttx].count(False) == 13

    def items(ns: str) -> Items:
        return Items(kv=(f"{ns}a", f"{ns}gone", f"{ns}never"),
                     rows=(("customers", f"{ns}c1"), ("orders", f"{ns}o1"), ("orders", "7")),
                     files=(f"{ns}docs/a.txt", f"{ns}docs/b.txt", f"{ns}docs/none.txt"))
    assert bench.receiver.settle(ns_a, [f"{ns_a}fx"], slack(1.0)) == set()
    a_state = read_agenttx(client, items(ns_a))
    a_state.effects = bench.receiver.delivered(ns_a)
    d_state = bench.run(bench.direct.read(items(ns_d)))
    d_state.effects = bench.receiver.delivered(ns_d)
    assert canonical(a_state, ns_a) == canonical(d_state, ns_d) == {
        "kv": {"a": {"n": 1}},
        "rows": {'customers/"c1"': {"name": "Ada"},
                 'orders/"o1"': {"customer_id": "c1", "total": 7.5}},
        "files": {"docs/a.txt": "héllo\n"},
        "effects": {"fx": {"channel": "webhook", "payloads": [{"order": "o1"}]}}}


def test_the_baselines_files_stay_inside_their_directory(bench, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    link = bench.direct.fs_root / f"link-{uuid.uuid4().hex[:8]}"
    link.symlink_to(outside, target_is_directory=True)
    with pytest.raises(ToolFailure, match="it resolves outside the sandbox"):
        bench.run(bench.direct.call("fs.write", encode({"path": f"{link.name}/x.txt",
                                                        "contents": "x"})))
    assert list(outside.iterdir()) == []


def _open_read_backs(bench: Bench) -> list[Any]:
    return list(bench.agenttx_agent.client.list_transactions(agent_id_prefix=READ_AGENT))


def test_the_read_back_sees_committed_data_only_and_leaves_nothing_open(bench):
    task = bench.new_task(MOVE)
    env = bench.set_up(task, "agenttx")
    result = bench.agent("agenttx").run(task, Injector(task, {}, env))
    assert result.finished, result.note
    assert result.effects == (f"{task.ns}m-0/moved",)
    exp = oracle.expect(task)
    # another agent's open transaction changes two items the read-back reads
    client = bench.agenttx_agent.client
    other = client.begin(agent_id="outcomes/test-uncommitted")
    assert other.step("kv.put", {"key": f"{task.ns}stock/wh-a/sku-0", "value": -1}).ok
    assert other.step("kv.delete", {"key": f"{task.ns}moves/draft-m-0"}).output["deleted"]
    try:
        final = bench.read_back(task, "agenttx", result.effects)
    finally:
        other.rollback(reason="test done")
    verdict = oracle.judge(final, exp, task.ns)
    assert (verdict.outcome, verdict.final_sha256) == (oracle.Outcome.CORRECT,
                                                       verdict.expected_sha256)
    for key in ("stock/wh-a/sku-0", "moves/draft-m-0"):
        assert final.kv[task.ns + key] == exp.primary.kv[task.ns + key]
    assert _open_read_backs(bench) == []


def test_the_read_back_reads_on_through_hundreds_of_absent_items(bench):
    """Each absent item is a failed read step; past the widest policy the service ends
    the transaction (GLOBAL_RESET, then ABORT), and the read-back begins another."""
    ns = f"r{uuid.uuid4().hex[:8]}/"
    client = bench.agenttx_agent.client
    with client.transaction(agent_id="outcomes/test") as tx:
        assert tx.step("kv.put", {"key": f"{ns}zz-present", "value": "here"}).ok
    absent = tuple(f"{ns}k{i:04d}" for i in range(17 * 17 + 10))
    state = read_agenttx(client, Items(kv=(*absent, f"{ns}zz-present"), rows=(), files=()))
    assert state.kv == {f"{ns}zz-present": "here"}
    assert _open_read_backs(bench) == []


# ---- the receiver: what "settled" means -----------------------------------------------------

def _post(receiver: Receiver, key: str) -> int:
    req = urllib.request.Request(receiver.url, data=b'{"channel": "webhook", "payload": 1}',
                                 headers={"Idempotency-Key": key}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def test_the_receiver_settles_once_every_refused_and_expected_key_is_confirmed():
    with Receiver() as receiver:
        assert receiver.settle("ns/", [], 0) == set()
        receiver.refuse("ns/k", 1)
        assert _post(receiver, "ns/k") == 503
        assert _post(receiver, "other/k") == 200
        assert receiver.settle("ns/", [], 0) == {"ns/k"}  # refused: being redelivered
        assert receiver.settle("ns/", ["ns/expected"], 0) == {"ns/k", "ns/expected"}
        assert _post(receiver, "ns/k") == 200
        assert receiver.settle("ns/", [], 0) == set()
        # a waiting settle wakes on the delivery it waits for, not on a clock
        got: list[set[str]] = []
        waiter = threading.Thread(target=lambda: got.append(
            receiver.settle("ns/", ["ns/expected"], 60)))
        started = time.monotonic()
        waiter.start()
        assert _post(receiver, "ns/expected") == 200
        waiter.join(timeout=60)
        assert got == [set()] and time.monotonic() - started < 30
        assert sorted(receiver.delivered("ns/")) == ["ns/expected", "ns/k"]
