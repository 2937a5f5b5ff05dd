"""Issue 9's defects, each pinned by a test of what a user hits (docs/api.md,
docs/tools.md, docs/recovery.md, docs/architecture.md, docs/operations.md):
hostile arguments never stall a replica, every reference counts for provenance, a
confirmed delivery is never re-sent, one lock per file, no stray temp files, and
readiness follows etcd."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import threading
import time
import uuid
from collections.abc import Iterator

import grpc
import pytest

from agenttx.embedded_etcd import EmbeddedEtcd
from agenttx.store.client import connect
from agenttx.v1 import agenttx_pb2 as pb
from support.certs import CertificateAuthority
from support.rpc import expect_error, expect_failure, get, output
from support.service import Agent, ServiceProcess
from support.waiting import eventually, eventually_async, slack

MIB = 1024 * 1024
JUMP = pb.ROLLBACK_STRATEGY_DEPENDENCY_JUMP


# ---- 1. arguments: linear, off the hot path ---------------------------------------------

HOSTILE = {
    "1e400-runs": '{"a":"' + "1e400 " * (MIB // 6 - 10) + '","b":1e400}',
    "escaped-quotes-unterminated": '{"a":"' + '\\"' * (MIB // 2 - 10),
    "unterminated-references": '{"a":"' + "${steps.1.a" * (MIB // 11 - 2) + '"}',
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shape", sorted(HOSTILE))
def test_a_mib_of_hostile_arguments_fails_cleanly_while_health_keeps_answering(replicas, shape):
    a, _ = replicas
    agent = Agent(a.stub)
    answered: list[float] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            t0 = time.monotonic()
            assert a.health() == "SERVING"
            answered.append(time.monotonic() - t0)

    thread = threading.Thread(target=probe)
    thread.start()
    try:
        for _ in range(3):
            resp = agent.step("kv.put", raw=HOSTILE[shape])
            assert resp.status == pb.STEP_STATUS_ROLLBACK_TRIGGERED
            assert resp.error_category in ("invalid_text_representation",
                                           "invalid_parameter_value", "undefined_object")
    finally:
        done.set()
        thread.join()
    assert answered and max(answered) < 2.0, max(answered)  # the old parser: minutes


def test_a_repeated_key_is_a_duplicate_field(agent):
    expect_failure(agent.step("kv.put", raw='{"key": "a", "value": 1, "key": "b"}'),
                   "invalid_parameter_value", '"key"')


def test_references_obey_the_json_nesting_limit(agent, uniq):
    deep = json.loads("[" * 120 + "1" + "]" * 120)
    output(agent.step("kv.put", {"key": f"deep-{uniq}", "value": deep}))
    nested: object = "${steps.1.value}"
    for _ in range(10):
        nested = [nested]
    hint = expect_failure(agent.step("kv.put", {"key": f"deeper-{uniq}", "value": nested}),
                          "program_limit_exceeded")
    assert "128" in hint, hint


def test_a_5000_digit_step_number_gets_a_clean_hint(agent):
    hint = expect_failure(agent.step("kv.put", {"key": "k", "value": "${steps." + "9" * 5000 + ".x}"}),
                          "undefined_object")
    assert "Exceeds the limit" not in hint and "int" not in hint.lower().split(), hint


# ---- 2. dependencies and culprits from every reference ----------------------------------

def test_a_failing_reference_keeps_the_dependencies_resolved_before_it(a, uniq):
    agent = Agent(a, max_local_depth=0)
    output(agent.step("kv.put", {"key": f"one-{uniq}", "value": {"v": 1}}))
    output(agent.step("kv.put", {"key": f"two-{uniq}", "value": 2}))
    output(agent.step("kv.put", {"key": f"three-{uniq}", "value": 3}))
    resp = agent.step("kv.put", {"key": f"x-{uniq}", "value": {
        "a": "${steps.3.value}", "b": "${steps.1.value.missing}"}})
    expect_failure(resp, "undefined_column")
    # depth exhausted: jump to the NEAREST dependency (3), not to step 1
    assert (resp.strategy, resp.rollback_to_step, resp.next_step_id) == (JUMP, 3, 3)


def test_a_culprit_reached_through_a_whole_object_reference_is_jumped_to(a, uniq):
    agent = Agent(a)
    output(agent.step("record.insert", {"table": f"c_{uniq}", "id": 1}))
    output(agent.step("kv.put", {"key": f"fields-{uniq}", "value": {"c": 404}}))
    resp = agent.step("record.insert", {"table": f"o_{uniq}", "id": 1,
                                        "fields": "${steps.2.value}",
                                        "references": {"c": f"c_{uniq}"}})
    expect_failure(resp, "foreign_key_violation", "404")
    assert (resp.strategy, resp.rollback_to_step, resp.next_step_id) == (JUMP, 2, 2)


# ---- 3. effects: never re-sent after a confirmed delivery; unique keys ------------------

@pytest.fixture
def own_etcd(scratch: pathlib.Path) -> Iterator[EmbeddedEtcd]:
    server = EmbeddedEtcd(scratch / f"etcd-{uuid.uuid4().hex[:8]}").start()
    yield server
    for member in server.members:  # never leave it stopped
        if member.process is not None and member.process.poll() is None:
            os.kill(member.process.pid, signal.SIGCONT)
    server.stop()


def _outage(etcd: EmbeddedEtcd, seconds: float) -> None:
    """etcd goes down now (SIGKILL: calls are refused, none is queued) and comes back on
    its data dir after `seconds`."""
    etcd.kill(0)
    threading.Timer(seconds, etcd.restart, (0,)).start()


@contextlib.contextmanager
def _paused(etcd: EmbeddedEtcd) -> Iterator[None]:
    """etcd SIGSTOPped for the block (an outage that loses nothing: what was sent to it is
    still processed once it resumes). Resumed when the block ends, not after a fixed time:
    on a busy machine a timer could resume it before the call under test even reached it."""
    pid = etcd.members[0].process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.mark.timeout(120)
async def test_a_delivery_confirmed_while_etcd_is_down_is_never_sent_again(
        own_etcd, scratch, sandbox, webhook):
    paused = threading.Event()
    outage_s, claim_s, poll_s = 10.0, 3, 0.2

    original = webhook.server.RequestHandlerClass.do_POST

    def pause_then_answer(handler):  # etcd goes away right as the receiver says 200
        if not paused.is_set():
            paused.set()
            _outage(own_etcd, outage_s)
        original(handler)

    webhook.server.RequestHandlerClass.do_POST = pause_then_answer
    channels = json.dumps({"hooks": {"kind": "webhook", "url": webhook.url}})
    svc = ServiceProcess("confirmer", etcd_endpoints=own_etcd.endpoints, prefix="/agenttx-fx",
                         fs_root=str(sandbox), workdir=scratch / "confirmer",
                         env={"AGENTTX_EFFECT_CHANNELS": channels},
                         extra_args=["--etcd-timeout-s", "1", "--effect-claim-s", str(claim_s),
                                     "--effect-poll-s", str(poll_s)]).start()
    try:
        agent = Agent(svc.stub)
        keys = [f"fx-{uuid.uuid4().hex[:8]}" for _ in range(3)]
        for key in keys:
            output(agent.step("effect.stage", {"channel": "hooks", "payload": key,
                                               "idempotency_key": key}))
        commit = agent.commit()
        assert commit.committed
        store = connect(own_etcd.endpoints, timeout=2)
        try:
            def retired() -> int:
                return sum(e.get("msg") == "retired a delivered effect after etcd returned"
                           for e in svc.logs())

            async def all_retired() -> bool:
                return retired() == len(keys) and \
                    not await store.get_prefix(b"/agenttx-fx/outbox/")

            # etcd comes back after the outage; each confirmed entry is then retired within
            # a dispatcher pass (the claim may have to run out first)
            await eventually_async(all_retired, slack(outage_s + claim_s + poll_s),
                                   "every confirmed delivery is retired",
                                   retry_on=(Exception,))  # etcd still down
            assert await store.get_prefix(b"/agenttx-fx/outbox/") == []
            assert retired() == len(keys)  # each confirmed delivery retired, none re-sent
        finally:
            await store.close()
        assert {k: webhook.keys()[k] for k in keys} == {k: 1 for k in keys}
    finally:
        svc.stop()


def test_an_idempotency_key_is_unique_while_staged_and_after_commit(a, b, uniq):
    key = f"once-{uniq}"
    first = Agent(a)
    output(first.step("effect.stage", {"channel": "log", "idempotency_key": key}))
    resp = first.step("effect.stage", {"channel": "log", "idempotency_key": key})
    assert resp.error_category == "unique_violation" and key in resp.clean_hint
    other = Agent(b)  # staged by another live transaction
    resp = other.step("effect.stage", {"channel": "log", "idempotency_key": key})
    assert resp.error_category == "unique_violation" and key in resp.clean_hint
    assert first.commit().committed
    later = Agent(b)  # committed and delivered: still reserved within the retention window
    resp = later.step("effect.stage", {"channel": "log", "idempotency_key": key})
    assert resp.error_category == "unique_violation", resp.clean_hint


def test_an_aborted_transaction_releases_its_idempotency_keys(a, b, uniq):
    key = f"freed-{uniq}"
    first = Agent(a)
    output(first.step("effect.stage", {"channel": "log", "idempotency_key": key}))
    first.rollback()
    output(Agent(b).step("effect.stage", {"channel": "log", "idempotency_key": key}))


# ---- 4. one lock per file, whatever its spelling ------------------------------------------

def test_a_symlink_alias_is_the_same_lock_and_a_rollback_never_deletes_anothers_file(
        a, b, sandbox, uniq):
    real = sandbox / f"real-{uniq}.txt"
    (sandbox / f"alias-{uniq}.txt").symlink_to(real.name)
    holder = Agent(a)
    output(holder.step("fs.write", {"path": real.name, "contents": "holder"}))
    other = Agent(b)
    for spelling in (f"alias-{uniq}.txt", f"./{real.name}", f"sub/../{real.name}"):
        resp = other.step("fs.write", {"path": spelling, "contents": "other"})
        if ".." in spelling:
            expect_failure(resp, "insufficient_privilege")
        else:
            expect_failure(resp, "lock_not_available")
    assert real.read_text() == "holder"
    holder.rollback()
    assert not real.exists()
    output(other.step("fs.write", {"path": f"alias-{uniq}.txt", "contents": "other"}))
    assert other.commit().committed
    assert real.read_text() == "other"


# ---- 5. no stray temp files ------------------------------------------------------------------

def _temp_files(root: pathlib.Path) -> list[pathlib.Path]:
    return [p for p in root.rglob("*.tmp") if ".agenttx-" in p.name]


@pytest.mark.timeout(120)
def test_a_step_whose_cas_raises_is_settled_as_not_applied_and_leaves_no_temp_file(
        own_etcd, scratch, sandbox):
    root = sandbox / f"tmp-{uuid.uuid4().hex[:8]}"
    # A temp file whose step etcd never recorded is the sweep's to remove, once older than
    # --temp-min-age-s (its smallest value); the reaper leader checks every idle timeout / 10.
    sweep_s, min_age_s, idle_s = 0.5, 10, 30
    svc = ServiceProcess("temps", etcd_endpoints=own_etcd.endpoints, prefix="/agenttx-tmp",
                         fs_root=str(root), workdir=scratch / "temps",
                         extra_args=["--etcd-timeout-s", "1", "--temp-sweep-s", str(sweep_s),
                                     "--temp-min-age-s", str(min_age_s),
                                     "--tx-idle-timeout-s", str(idle_s)]).start()
    try:
        agent = Agent(svc.stub)
        output(agent.step("kv.put", {"key": "warm", "value": 1}))
        with _paused(own_etcd), pytest.raises(grpc.RpcError) as err:
            agent.step("fs.write", {"path": "during-outage.txt", "contents": "x"})
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value.details()
        # The write's outcome is unknown: its temp file stays (if etcd recorded the step,
        # that file is what tells the next call the rename never happened) ...
        assert not (root / "during-outage.txt").exists()
        svc.wait_health(("SERVING",), timeout=40)
        # whatever etcd recorded, the write is settled as not having happened
        view = _retry(lambda: get(svc.stub, agent.tx))
        assert view.next_step_id == 2
        assert not (root / "during-outage.txt").exists()
        output(agent.step("fs.write", {"path": "during-outage.txt", "contents": "y"}))
        assert agent.commit().committed
        assert (root / "during-outage.txt").read_text() == "y"
        # ... and once etcd answers, it is removed: rolled back with the step by the calls
        # above, or, if etcd never recorded the step (the request was cancelled before etcd
        # read it), swept once it is older than --temp-min-age-s
        eventually(lambda: _temp_files(root) == [], slack(min_age_s + sweep_s + idle_s / 10),
                   "the temp file is removed")
    finally:
        svc.stop()


def _retry(fn, timeout: float = slack(5.0)):
    """`fn()` once etcd answers again: UNAVAILABLE and FAILED_PRECONDITION ("still being
    applied") are retried until `timeout`, any other error fails at once."""
    def attempt():
        try:
            return fn()
        except grpc.RpcError as err:
            if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION):
                raise AssertionError(f"{err.code().name}: {err.details()}") from err
            raise
    return eventually(attempt, timeout, "the call answers once etcd is back",
                      retry_on=(AssertionError,))


def test_temp_files_whose_step_is_gone_are_swept(etcd, scratch, sandbox):
    root = sandbox / f"sweep-{uuid.uuid4().hex[:8]}"
    (root / "deep").mkdir(parents=True)
    stray = root / "deep" / f".file.txt.agenttx-{uuid.uuid4()}-3-{'ab' * 6}.tmp"
    stray.write_text("left by a replica that died before its step's CAS")
    old = time.time() - 3600
    os.utime(stray, (old, old))
    fresh = root / f".other.txt.agenttx-{uuid.uuid4()}-1-{'cd' * 6}.tmp"
    fresh.write_text("a step in flight right now")
    restore = root / f".x.txt.agenttx-restore-{'ef' * 6}.tmp"
    restore.write_text("an undo's restore cut short")
    os.utime(restore, (old, old))
    # The reaper leader sweeps every --temp-sweep-s, checked on each of its passes (every
    # idle timeout / 10 here); the fresh file stays far below --temp-min-age-s.
    sweep_s, idle_s, min_age_s = 0.5, 10, 300
    svc = ServiceProcess("sweeper", etcd_endpoints=etcd.endpoints,
                         prefix=f"/agenttx-sweep-{uuid.uuid4().hex[:8]}", fs_root=str(root),
                         workdir=scratch / "sweeper",
                         extra_args=["--temp-sweep-s", str(sweep_s),
                                     "--tx-idle-timeout-s", str(idle_s),
                                     "--temp-min-age-s", str(min_age_s)]).start()
    try:
        eventually(lambda: not stray.exists() and not restore.exists(),
                   slack(sweep_s + idle_s / 10), "the stray temp files are swept")
        assert fresh.exists()  # too young to be a leftover
    finally:
        svc.stop()


# ---- 6. readiness follows etcd -------------------------------------------------------------

@pytest.mark.timeout(120)
def test_health_is_not_serving_while_etcd_is_unreachable_and_serving_once_it_returns(
        own_etcd, scratch, sandbox):
    svc = ServiceProcess("ready", etcd_endpoints=own_etcd.endpoints, prefix="/agenttx-ready",
                         fs_root=str(sandbox), workdir=scratch / "ready").start()
    try:
        assert svc.health() == svc.health("agenttx.v1.AgentTxService") == "SERVING"
        pid = own_etcd.members[0].process.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            svc.wait_health(("NOT_SERVING",), timeout=15)
            assert svc.health("agenttx.v1.AgentTxService") == "NOT_SERVING"
        finally:
            os.kill(pid, signal.SIGCONT)
        svc.wait_health(("SERVING",), timeout=30)
        assert svc.health("agenttx.v1.AgentTxService") == "SERVING"
    finally:
        svc.stop()


def test_health_is_not_serving_when_etcd_cannot_be_reached_with_a_wrong_ca(
        etcd, scratch, sandbox):
    ca = CertificateAuthority("not the etcd CA").write(scratch / f"ca-{uuid.uuid4().hex[:6]}")
    svc = ServiceProcess("wrong-ca", etcd_endpoints=etcd.endpoints, prefix="/agenttx-ca",
                         fs_root=str(sandbox), workdir=scratch / "wrong-ca",
                         extra_args=["--etcd-ca-file", str(ca)]).start(serving=False)
    try:
        assert svc.wait_health(("NOT_SERVING",), timeout=15) == "NOT_SERVING"
        expect_error(svc.stub.BeginTransaction, pb.BeginTransactionRequest(),
                     grpc.StatusCode.UNAVAILABLE)
        assert svc.health() == "NOT_SERVING"
    finally:
        svc.stop()


@pytest.mark.timeout(90)
def test_an_idempotency_key_is_free_again_after_the_retention_window(etcd, scratch, sandbox):
    svc = ServiceProcess("retention", etcd_endpoints=etcd.endpoints,
                         prefix=f"/agenttx-ret-{uuid.uuid4().hex[:6]}", fs_root=str(sandbox),
                         workdir=scratch / "retention",
                         extra_args=["--effect-key-retention-s", "2"]).start()
    try:
        key = f"ret-{uuid.uuid4().hex[:8]}"
        first = Agent(svc.stub)
        output(first.step("effect.stage", {"channel": "log", "idempotency_key": key}))
        assert first.commit().committed
        again = Agent(svc.stub)
        resp = again.step("effect.stage", {"channel": "log", "idempotency_key": key})
        assert resp.error_category == "unique_violation"   # within the window
        again.rollback()

        def staged() -> Agent | None:
            attempt = Agent(svc.stub)  # a fresh transaction each time: no retry budget spent
            resp = attempt.step("effect.stage", {"channel": "log", "idempotency_key": key})
            if resp.status == pb.STEP_STATUS_SUCCESS:
                return attempt
            assert resp.error_category == "unique_violation"
            attempt.rollback()
            return None

        # free once the retention (2 s) and its lease bucket (1 s) ran out, on etcd's clock
        attempt = eventually(staged, slack(2 + 1), "the key expires after its retention")
        assert attempt.commit().committed
    finally:
        svc.stop()
