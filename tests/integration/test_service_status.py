"""GetServiceStatus against a real replica and a real etcd (docs/api.md, docs/console.md).

Pinned: the counts are the deployment's (every principal's) open transactions, outbox
entries and dead letters; they move as transactions open and end and as a real loopback
receiver refuses deliveries; each is one count-only etcd read (three round trips in the
RPC's log line, whatever the deployment holds); any authenticated caller may ask, and
the answer says who the service took them for; with etcd unreachable the replica still
answers, with `etcd_reachable` false.
"""

from __future__ import annotations

import json
import pathlib
import uuid
from collections.abc import Iterator

import pytest

from agenttx.auth import hash_token
from agenttx.client import Client, Unauthenticated
from agenttx.embedded_etcd import free_port
from support.receivers import WebhookReceiver
from support.service import ServiceProcess
from support.waiting import eventually, slack

POLL_S = 0.2
TOKENS = {"alice-t0ken": ("alice", "team-a", ["agent"]),
          "bob-t0ken": ("bob", "team-b", ["agent"]),
          "ops-t0ken": ("ops", "agenttx-system", ["admin"])}


@pytest.fixture(scope="module")
def replica(etcd, scratch, sandbox) -> Iterator[tuple[ServiceProcess, WebhookReceiver]]:
    path = pathlib.Path(scratch) / f"status-tokens-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps({"tokens": [
        {"sha256": hash_token(t), "principal": p, "namespace": ns, "roles": r}
        for t, (p, ns, r) in TOKENS.items()]}))
    with WebhookReceiver() as hooks:
        channels = {"hooks": {"kind": "webhook", "url": hooks.url, "timeout_s": 2}}
        proc = ServiceProcess(
            "status-0", etcd_endpoints=etcd.endpoints,
            prefix=f"/agenttx-status-{uuid.uuid4().hex[:6]}", fs_root=str(sandbox),
            workdir=scratch / "status", env={"AGENTTX_EFFECT_CHANNELS": json.dumps(channels)},
            extra_args=["--auth", "token", "--auth-tokens-file", str(path),
                        "--effect-poll-s", str(POLL_S), "--leader-ttl-s", "2"]).start()
        yield proc, hooks
        proc.stop()


def counts(client: Client) -> tuple[bool, int, int, int]:
    s = client.status()
    return s.etcd_reachable, s.open_transactions, s.outbox_depth, s.dead_letters


def test_status_counts_every_principals_open_transactions_outbox_and_dead_letters(replica):
    proc, hooks = replica
    with proc.client(token="alice-t0ken") as alice, proc.client(token="bob-t0ken") as bob:
        assert counts(alice) == (True, 0, 0, 0)
        alice_tx = alice.begin(agent_id="billing")
        bob.begin(agent_id="support")
        assert counts(alice) == (True, 2, 0, 0)  # bob's counts too; neither is named

        waiting, refused = f"wait-{uuid.uuid4().hex[:6]}", f"refused-{uuid.uuid4().hex[:6]}"
        hooks.script(waiting, *[503] * 200)   # transient: stays in the outbox
        hooks.script(refused, 400)            # permanent: becomes a dead letter
        for key in (waiting, refused):
            assert alice_tx.step("effect.stage", {"channel": "hooks", "payload": {},
                                                  "idempotency_key": key}).ok
        assert alice_tx.commit().committed
        eventually(lambda: counts(bob) == (True, 1, 1, 1), slack(2 * POLL_S + 2),
                   "one open transaction, one effect waiting, one dead letter")

        status = bob.status()
        assert (status.principal, status.admin, status.replica_id) == ("bob", False, "status-0")
        assert status.version
    with proc.client(token="ops-t0ken") as ops:
        assert (ops.status().principal, ops.status().admin) == ("ops", True)
    with proc.client() as nobody, pytest.raises(Unauthenticated, match="missing credentials"):
        nobody.status()


def test_each_count_is_one_count_only_read(replica):
    proc, _ = replica
    with proc.client(token="alice-t0ken") as alice:
        for _ in range(5):
            alice.begin(agent_id="many")
        alice.status()
    lines = [r for r in proc.logs() if r.get("rpc") == "GetServiceStatus"
             and r.get("code") == "OK"]
    assert lines and lines[-1]["etcd_round_trips"] == 3
    assert lines[-1]["principal"] == "alice"


def test_status_answers_with_etcd_unreachable(scratch, sandbox):
    nowhere = f"127.0.0.1:{free_port()}"  # nothing listens there
    proc = ServiceProcess("status-no-etcd", etcd_endpoints=[nowhere],
                          prefix="/agenttx-status-x", fs_root=str(sandbox),
                          workdir=scratch / "status-x", extra_args=["--etcd-timeout-s", "1"])
    proc.start(serving=False)
    try:
        with proc.client() as client:
            status = client.status()
        assert (status.etcd_reachable, status.open_transactions, status.outbox_depth,
                status.dead_letters) == (False, 0, 0, 0)
        assert (status.principal, status.admin, status.replica_id) == ("", True,
                                                                      "status-no-etcd")
    finally:
        proc.stop()
