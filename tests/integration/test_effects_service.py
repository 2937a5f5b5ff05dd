"""Effects end to end through the real service: webhook and SMTP receivers on loopback."""

from __future__ import annotations

import email
import email.policy
import json
import time
import uuid

import pytest

from agenttx.effects.channels import message_id
from support.service import Agent, ServiceProcess


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
                         extra_args=["--effect-claim-s", "2", "--effect-poll-s", "0.2",
                                     "--leader-ttl-s", "2"]).start()
    yield svc
    svc.stop()


def _wait(cond, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


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
    time.sleep(1.0)
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
    time.sleep(1.0)
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
    _wait(lambda: webhook.keys()[key] == 2, timeout=20)
    time.sleep(1.5)
    assert webhook.keys()[key] == 2  # delivery confirmed: never sent again


def test_staging_on_an_unknown_channel_is_undefined_object(service):
    agent = Agent(service.stub)
    resp = agent.step("effect.stage", {"channel": "sms", "payload": 1})
    assert resp.error_category == "undefined_object"
    assert "sms" in resp.clean_hint and "hooks" in resp.clean_hint
