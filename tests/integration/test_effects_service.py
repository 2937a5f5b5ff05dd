"""Effects end to end through the real service: webhook and SMTP receivers on loopback."""

from __future__ import annotations

import email
import email.policy
import json
import uuid

import pytest

from agenttx.effects.channels import message_id
from support.outbox import outbox_is_empty
from support.service import Agent, ServiceProcess
from support.waiting import eventually, slack

CLAIM_S = 2         # --effect-claim-s
POLL_S = 0.2        # --effect-poll-s
BASE_BACKOFF_S = 0.5  # the dispatcher's first backoff cap


@pytest.fixture
def service(etcd, scratch, sandbox, webhook, smtp):
    sink, port = smtp
    channels = {
        "hooks": {"kind": "webhook", "url": webhook.url, "timeout_s": 2},
        "mail": {"kind": "email", "host": "127.0.0.1", "port": port,
                 "from_addr": "agenttx@example.test"},
    }
    svc = ServiceProcess(f"effects-{uuid.uuid4().hex[:4]}", etcd_endpoints=etcd.endpoints,
                         prefix=f"/agenttx-fx-{uuid.uuid4().hex[:6]}", fs_root=str(sandbox),
                         workdir=scratch / "effects",
                         env={"AGENTTX_EFFECT_CHANNELS": json.dumps(channels)},
                         extra_args=["--effect-claim-s", str(CLAIM_S),
                                     "--effect-poll-s", str(POLL_S),
                                     "--leader-ttl-s", "2"]).start()
    yield svc
    svc.stop()


def test_commit_delivers_webhook_and_email_once_each(service, webhook, smtp):
    sink, _ = smtp
    agent = Agent(service.stub)
    hook_key = f"hook-{uuid.uuid4().hex[:6]}"
    agent.ok("effect.stage", {"channel": "hooks", "payload": {"order": 7},
                              "idempotency_key": hook_key})
    mail = agent.ok("effect.stage", {"channel": "mail", "payload": {
        "to": "ops@example.test", "subject": "Order 7", "body": "placed"}})
    done = agent.commit()
    assert (done.committed, done.effects_dispatched, list(done.dispatch_errors)) == (True, 2, [])
    [req] = webhook.requests
    assert req["headers"]["Idempotency-Key"] == hook_key
    assert json.loads(req["body"]) == {"channel": "hooks", "payload": {"order": 7},
                                       "idempotency_key": hook_key,
                                       "transaction_id": agent.tx}
    [env] = sink.envelopes
    msg = email.message_from_bytes(env.content, policy=email.policy.default)
    assert (msg["To"], msg["Subject"]) == ("ops@example.test", "Order 7")
    assert msg["Message-ID"] == message_id(mail["idempotency_key"])
    # delivered during the commit and deleted from the outbox: nothing can send them again
    eventually(lambda: outbox_is_empty(service), slack(POLL_S), "the entries are retired")
    assert len(webhook.requests) == 1 and len(sink.envelopes) == 1


def test_rolled_back_and_aborted_effects_are_never_sent(service, webhook):
    agent = Agent(service.stub)
    agent.ok("kv.put", {"key": f"fx-{uuid.uuid4().hex[:6]}", "value": 1})
    agent.ok("effect.stage", {"channel": "hooks", "payload": "undone"})
    assert agent.rollback(to_step=2).next_step_id == 2
    kept = agent.ok("effect.stage", {"channel": "hooks", "payload": "kept"})
    assert agent.commit().effects_dispatched == 1
    aborted = Agent(service.stub)
    aborted.ok("effect.stage", {"channel": "hooks", "payload": "aborted"})
    aborted.rollback()
    # only committed effects enter the outbox, and it is empty: nothing more will be sent
    eventually(lambda: outbox_is_empty(service), slack(POLL_S), "the entry is retired")
    assert [json.loads(r["body"])["payload"] for r in webhook.requests] == ["kept"]
    assert webhook.keys() == {kept["idempotency_key"]: 1}


def test_a_failed_delivery_is_reported_and_retried_in_the_background(service, webhook):
    webhook.status = 503
    agent = Agent(service.stub)
    key = f"retry-{uuid.uuid4().hex[:6]}"
    agent.ok("effect.stage", {"channel": "hooks", "payload": 1, "idempotency_key": key})
    done = agent.commit()
    assert done.committed and done.effects_dispatched == 0
    assert len(done.dispatch_errors) == 1 and key in done.dispatch_errors[0]
    assert "503" in done.dispatch_errors[0]
    webhook.status = 200
    # the receiver counts every POST: the refused one, then the background retry
    # retried after the first backoff, once the committing replica's claim ran out
    eventually(lambda: webhook.keys()[key] == 2,
               slack(CLAIM_S + BASE_BACKOFF_S + POLL_S), "the background retry")
    # confirmed, then deleted from the outbox: never sent again
    eventually(lambda: outbox_is_empty(service), slack(POLL_S), "the entry is retired")
    assert webhook.keys()[key] == 2


def test_staging_on_an_unknown_channel_is_undefined_object(service):
    agent = Agent(service.stub)
    resp = agent.step("effect.stage", {"channel": "sms", "payload": 1})
    assert resp.error_category == "undefined_object"
    assert "sms" in resp.clean_hint and "hooks" in resp.clean_hint
