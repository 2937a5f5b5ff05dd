"""Effect channel configuration (AGENTTX_EFFECT_CHANNELS) and payload shaping; no I/O."""

import hashlib
import json

import pytest

from agenttx.effects.channels import (
    ChannelRegistry,
    Effect,
    EmailChannel,
    LogChannel,
    WebhookChannel,
    email_payload,
    message_id,
    webhook_body,
)


def test_log_channel_exists_when_nothing_is_configured():
    empties: tuple[dict[str, object] | str | None, ...] = (None, "", "  ", {}, "{}")
    for empty in empties:
        reg = ChannelRegistry.from_config(empty)
        assert reg.names() == ["log"]
        assert reg.has("log") and not reg.has("webhook")
        assert isinstance(reg.get("log"), LogChannel)


def test_valid_config_parses_every_kind_with_defaults():
    raw = {
        "hooks": {"kind": "webhook", "url": "https://example.com/in",
                  "headers": {"Authorization": "Bearer t"}},
        "mail": {"kind": "email", "host": "smtp.local", "from_addr": "agenttx@example.com"},
        "audit": {"kind": "log"},
    }
    for form in (raw, json.dumps(raw)):
        reg = ChannelRegistry.from_config(form)
        assert reg.names() == ["audit", "hooks", "log", "mail"]
        hook = reg.get("hooks")
        assert isinstance(hook, WebhookChannel)
        assert hook.timeout_s == 5 and hook.headers == {"Authorization": "Bearer t"}
        mail = reg.get("mail")
        assert isinstance(mail, EmailChannel)
        assert (mail.port, mail.starttls, mail.username, mail.password, mail.timeout_s) == (
            25, False, None, None, 10)


def test_email_password_is_not_shown_in_repr():
    reg = ChannelRegistry.from_config({"m": {"kind": "email", "host": "h", "from_addr": "a@b.c",
                                             "username": "u", "password": "hunter2"}})
    assert "hunter2" not in repr(reg.get("m"))


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"hooks": {"kind": "sms"}},
         "channel 'hooks' field 'kind': kind must be one of 'log', 'webhook', 'email'"),
        ({"hooks": {"url": "http://x"}}, "channel 'hooks' field 'kind': missing field `kind`"),
        ({"hooks": {"kind": "webhook"}}, "channel 'hooks' field 'url': Field required"),
        ({"hooks": {"kind": "webhook", "url": "ftp://x/y"}},
         "channel 'hooks' field 'url': url must be an absolute http:// or https:// URL"),
        ({"hooks": {"kind": "webhook", "url": "http://x", "timeout_s": 0}},
         "channel 'hooks' field 'timeout_s'"),
        ({"hooks": {"kind": "webhook", "url": "http://x", "headers": {"Idempotency-Key": "k"}}},
         "channel 'hooks' field 'headers': may not set Idempotency-Key"),
        ({"hooks": {"kind": "webhook", "url": "http://x", "retries": 3}},
         "channel 'hooks' field 'retries': Extra inputs are not permitted"),
        ({"mail": {"kind": "email", "from_addr": "a@b.c"}},
         "channel 'mail' field 'host': Field required"),
        ({"mail": {"kind": "email", "host": "h", "from_addr": "a@b.c", "port": 70000}},
         "channel 'mail' field 'port'"),
        ({"log": {"kind": "webhook", "url": "http://x"}},
         "channel 'log' field 'kind': the built-in 'log' channel must have kind 'log'"),
        ({"hooks": "webhook"}, "channel 'hooks': must be an object with a `kind`"),
        ({"bad name": {"kind": "log"}}, "channel name 'bad name' must match"),
        ("[1, 2]", "must be a JSON object"),
        ("{not json", "not valid JSON"),
    ],
)
def test_bad_config_names_the_channel_and_field(config, message):
    with pytest.raises(ValueError) as err:
        ChannelRegistry.from_config(config)
    assert str(err.value).startswith("AGENTTX_EFFECT_CHANNELS: ")
    assert message in str(err.value)


def test_webhook_body_is_exactly_the_four_fields():
    body = webhook_body(Effect("hooks", {"n": 1, "s": "é"}, "k-1", "tx-1"))
    assert json.loads(body) == {"channel": "hooks", "payload": {"n": 1, "s": "é"},
                                "idempotency_key": "k-1", "transaction_id": "tx-1"}


def test_message_id_is_derived_from_the_idempotency_key():
    digest = hashlib.sha256(b"order-42").hexdigest()[:32]
    assert message_id("order-42") == f"<{digest}@agenttx>"
    assert message_id("order-42") == message_id("order-42") != message_id("order-43")


def test_email_payload_validation_names_the_field():
    assert email_payload({"to": "a@b.c", "subject": "s", "body": "b"}).to == ["a@b.c"]
    assert email_payload({"to": ["a@b.c", "d@e.f"], "subject": "", "body": ""}).to == [
        "a@b.c", "d@e.f"]
    for payload, field in [
        ({"subject": "s", "body": "b"}, "`to`"),
        ({"to": [], "subject": "s", "body": "b"}, "`to`"),
        ({"to": "a@b.c", "body": "b"}, "`subject`"),
        ({"to": "a@b.c", "subject": "s", "body": 5}, "`body`"),
        ({"to": "a@b.c", "subject": "s\nBcc: x", "body": "b"}, "`subject`"),
        ({"to": "a@b.c", "subject": "s", "body": "b", "cc": "x"}, "`cc`"),
        ("hello", "must be an object"),
    ]:
        with pytest.raises(ValueError, match=field):
            email_payload(payload)


def test_validate_payload_rejects_unknown_channel_and_bad_email():
    reg = ChannelRegistry.from_config({"m": {"kind": "email", "host": "h", "from_addr": "a@b"}})
    reg.validate_payload("log", {"anything": [1]})
    with pytest.raises(ValueError, match="unknown channel 'sms' \\(configured: log, m\\)"):
        reg.validate_payload("sms", {})
    with pytest.raises(ValueError, match="`to`"):
        reg.validate_payload("m", {"subject": "s", "body": "b"})
