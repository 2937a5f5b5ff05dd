"""Effect channels: where a committed effect goes, configured rather than hard-coded.

Why this module exists: `effect.stage` must reject an unknown channel at stage time and
the outbox must deliver to whatever the operator configured in `AGENTTX_EFFECT_CHANNELS`
(JSON object, name -> `{"kind": "log" | "webhook" | "email", ...}`). The `log` channel is
always on, so a deployment with nothing configured can still stage and commit effects.

Delivery contract: `ChannelRegistry.deliver` returns only when the receiver confirmed
(webhook 2xx, SMTP accepted the message, log line written) and raises `DeliveryError`
otherwise. Every delivery carries the effect's idempotency key (HTTP header
`Idempotency-Key`; SMTP `Message-ID` derived from it plus `X-Idempotency-Key`) so a
receiver can dedupe the redeliveries an at-least-once outbox may make.

What it must never do: touch etcd, retry on its own (the outbox decides when to try
again), or put secrets (passwords, header values, URL query strings) in error messages.
Blocking stdlib clients (`http.client`, `smtplib`) run in a worker thread so the event
loop never stalls; no extra HTTP dependency is needed for one POST.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import json
import logging
import re
import smtplib
import ssl
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import formatdate
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    TypeAdapter,
    ValidationError,
    field_validator,
)

log = logging.getLogger("agenttx.effects")

CHANNEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# Read at most this much of a webhook's response body (we only need the status).
_MAX_RESPONSE_BYTES = 64 * 1024


class DeliveryError(Exception):
    """The receiver did not confirm the delivery. The message is safe to show a caller."""


@dataclass(frozen=True)
class Effect:
    """One effect as the outbox hands it to a channel."""

    channel: str
    payload: Any
    idempotency_key: str
    transaction_id: str


# ---- configuration models --------------------------------------------------------------

class _Channel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LogChannel(_Channel):
    """Writes one structured line to the `agenttx.effects` logger. Never fails."""

    kind: Literal["log"]


class WebhookChannel(_Channel):
    """HTTP(S) POST of the effect as JSON; any 2xx answer means delivered."""

    kind: Literal["webhook"]
    url: str = Field(description="http:// or https:// URL receiving the POST")
    timeout_s: float = Field(5.0, gt=0, le=300, description="connect + response timeout")
    headers: dict[str, str] = Field(default_factory=dict, description="extra request headers")

    @field_validator("url")
    @classmethod
    def _absolute_http_url(cls, url: str) -> str:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("url must be an absolute http:// or https:// URL")
        return url

    @field_validator("headers")
    @classmethod
    def _no_reserved_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        reserved = {"content-type", "content-length", "idempotency-key", "host"}
        clash = sorted(h for h in headers if h.lower() in reserved)
        if clash:
            raise ValueError(f"may not set {', '.join(clash)} (set by AgentTx)")
        return headers


class EmailChannel(_Channel):
    """SMTP delivery; the payload carries `to`, `subject` and `body`."""

    kind: Literal["email"]
    host: str = Field(min_length=1)
    port: int = Field(25, ge=1, le=65535)
    from_addr: str = Field(min_length=3)
    starttls: bool = False
    username: str | None = None
    password: SecretStr | None = None
    timeout_s: float = Field(10.0, gt=0, le=300)


ChannelConfig = Annotated[LogChannel | WebhookChannel | EmailChannel, Field(discriminator="kind")]
_CHANNEL_ADAPTER: TypeAdapter[LogChannel | WebhookChannel | EmailChannel] = TypeAdapter(
    ChannelConfig
)


def _describe(name: str, err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"] if p not in ("log", "webhook", "email"))
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "union_tag_invalid":
        msg = "kind must be one of 'log', 'webhook', 'email'"
        loc = "kind"
    elif first["type"] == "union_tag_not_found":
        msg = "missing field `kind` ('log', 'webhook' or 'email')"
        loc = "kind"
    where = f" field '{loc}'" if loc else ""
    return f"AGENTTX_EFFECT_CHANNELS: channel '{name}'{where}: {msg}"


# ---- email payload ---------------------------------------------------------------------

@dataclass(frozen=True)
class EmailPayload:
    to: list[str]
    subject: str
    body: str


def email_payload(payload: Any) -> EmailPayload:
    """Validate an email effect's payload; ValueError names the offending field."""
    if not isinstance(payload, Mapping):
        raise ValueError("email payload must be an object with `to`, `subject`, `body`")
    unknown = sorted(set(payload) - {"to", "subject", "body"})
    if unknown:
        raise ValueError(f"email payload: unknown field `{unknown[0]}`")
    to = payload.get("to")
    if isinstance(to, str):
        to = [to]
    if not isinstance(to, list) or not to or not all(isinstance(a, str) and a for a in to):
        raise ValueError("email payload: `to` must be an address or a non-empty list of them")
    for field in ("subject", "body"):
        if not isinstance(payload.get(field), str):
            raise ValueError(f"email payload: `{field}` must be a string")
    if "\n" in payload["subject"] or "\r" in payload["subject"]:
        raise ValueError("email payload: `subject` must be one line")
    return EmailPayload(list(to), payload["subject"], payload["body"])


def message_id(idempotency_key: str) -> str:
    """The Message-ID of an email effect: the same key always gives the same id, so a
    mail system that dedupes on Message-ID drops a redelivery."""
    return f"<{hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]}@agenttx>"


def webhook_body(effect: Effect) -> bytes:
    return json.dumps(
        {
            "channel": effect.channel,
            "payload": effect.payload,
            "idempotency_key": effect.idempotency_key,
            "transaction_id": effect.transaction_id,
        },
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode()


# ---- blocking senders (run in a worker thread) -------------------------------------------

def _post_webhook(cfg: WebhookChannel, effect: Effect) -> None:
    parts = urllib.parse.urlsplit(cfg.url)
    host, port = parts.hostname or "", parts.port
    target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(
            host, port, timeout=cfg.timeout_s, context=ssl.create_default_context()
        )
    else:
        conn = http.client.HTTPConnection(host, port, timeout=cfg.timeout_s)
    body = webhook_body(effect)
    headers = {
        **cfg.headers,
        "Content-Type": "application/json",
        "Idempotency-Key": effect.idempotency_key,
    }
    where = f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}"
    try:
        conn.request("POST", target, body=body, headers=headers)
        resp = conn.getresponse()
        resp.read(_MAX_RESPONSE_BYTES)
    except TimeoutError as exc:
        raise DeliveryError(f"{where} timed out after {cfg.timeout_s:g}s") from exc
    except ConnectionRefusedError as exc:
        raise DeliveryError(f"{where} refused the connection") from exc
    except (OSError, http.client.HTTPException) as exc:
        raise DeliveryError(f"{where} failed: {type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()
    if not 200 <= resp.status < 300:
        raise DeliveryError(f"{where} answered HTTP {resp.status} {resp.reason}".rstrip())


def _send_email(cfg: EmailChannel, effect: Effect) -> None:
    try:
        mail = email_payload(effect.payload)
    except ValueError as exc:
        raise DeliveryError(str(exc)) from exc
    msg = EmailMessage()
    msg["From"] = cfg.from_addr
    msg["To"] = ", ".join(mail.to)
    msg["Subject"] = mail.subject
    msg["Date"] = formatdate(localtime=False, usegmt=True)
    msg["Message-ID"] = message_id(effect.idempotency_key)
    msg["X-Idempotency-Key"] = effect.idempotency_key
    msg["X-AgentTx-Transaction-Id"] = effect.transaction_id
    msg.set_content(mail.body)
    where = f"smtp://{cfg.host}:{cfg.port}"
    try:
        with smtplib.SMTP(cfg.host, cfg.port, timeout=cfg.timeout_s) as smtp:
            if cfg.starttls:
                smtp.starttls(context=ssl.create_default_context())
            if cfg.username:
                password = cfg.password.get_secret_value() if cfg.password else ""
                smtp.login(cfg.username, password)
            refused = smtp.send_message(msg, from_addr=cfg.from_addr, to_addrs=mail.to)
    except smtplib.SMTPResponseException as exc:
        raise DeliveryError(f"{where} answered {exc.smtp_code}") from exc
    except smtplib.SMTPRecipientsRefused as exc:
        raise DeliveryError(f"{where} refused every recipient") from exc
    except TimeoutError as exc:
        raise DeliveryError(f"{where} timed out after {cfg.timeout_s:g}s") from exc
    except ConnectionRefusedError as exc:
        raise DeliveryError(f"{where} refused the connection") from exc
    except (OSError, smtplib.SMTPException) as exc:
        raise DeliveryError(f"{where} failed: {type(exc).__name__}: {exc}") from exc
    if refused:
        # Partially accepted: the accepted recipients got it, so a retry would resend to
        # them; report it as delivered-with-warning rather than loop forever.
        log.warning("email effect partially refused",
                    extra={"channel": effect.channel, "idempotency_key": effect.idempotency_key,
                           "refused": sorted(refused)})


# ---- registry ----------------------------------------------------------------------------

class ChannelRegistry:
    """The configured channels, by name. Immutable once built."""

    def __init__(self, channels: Mapping[str, LogChannel | WebhookChannel | EmailChannel]):
        self._channels = dict(channels)
        self._channels.setdefault("log", LogChannel(kind="log"))

    @classmethod
    def from_config(cls, obj: Mapping[str, Any] | str | None) -> ChannelRegistry:
        """Build from `AGENTTX_EFFECT_CHANNELS` (a JSON string or the parsed object).

        Raises ValueError naming the channel and the field when the config is wrong.
        """
        if obj is None or (isinstance(obj, str) and not obj.strip()):
            return cls({})
        if isinstance(obj, str):
            try:
                obj = json.loads(obj)
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"AGENTTX_EFFECT_CHANNELS: not valid JSON: {exc.msg} at line {exc.lineno} "
                    f"column {exc.colno}"
                ) from exc
        if not isinstance(obj, Mapping):
            raise ValueError("AGENTTX_EFFECT_CHANNELS: must be a JSON object (name -> config)")
        channels: dict[str, LogChannel | WebhookChannel | EmailChannel] = {}
        for name, raw in obj.items():
            if not isinstance(name, str) or not CHANNEL_NAME.match(name):
                raise ValueError(
                    f"AGENTTX_EFFECT_CHANNELS: channel name {name!r} must match "
                    f"{CHANNEL_NAME.pattern}"
                )
            if isinstance(raw, BaseModel):
                raw = raw.model_dump()
            if not isinstance(raw, Mapping):
                raise ValueError(
                    f"AGENTTX_EFFECT_CHANNELS: channel '{name}': must be an object with a "
                    "`kind` ('log', 'webhook' or 'email')"
                )
            try:
                cfg = _CHANNEL_ADAPTER.validate_python(raw)
            except ValidationError as exc:
                raise ValueError(_describe(name, exc)) from None
            if name == "log" and not isinstance(cfg, LogChannel):
                raise ValueError(
                    "AGENTTX_EFFECT_CHANNELS: channel 'log' field 'kind': the built-in "
                    "'log' channel must have kind 'log'"
                )
            channels[name] = cfg
        return cls(channels)

    def names(self) -> list[str]:
        return sorted(self._channels)

    def has(self, name: str) -> bool:
        return name in self._channels

    def get(self, name: str) -> LogChannel | WebhookChannel | EmailChannel | None:
        return self._channels.get(name)

    def validate_payload(self, name: str, payload: Any) -> None:
        """Stage-time check (ValueError): channel known and the payload usable by it.
        Lets `effect.stage` fail early instead of the outbox retrying a hopeless entry."""
        cfg = self._channels.get(name)
        if cfg is None:
            raise ValueError(f"unknown channel '{name}' (configured: {', '.join(self.names())})")
        if isinstance(cfg, EmailChannel):
            email_payload(payload)

    async def deliver(self, effect: Effect) -> None:
        """Deliver one effect; returns only on a confirmed delivery, else DeliveryError."""
        cfg = self._channels.get(effect.channel)
        if cfg is None:
            raise DeliveryError(f"unknown channel '{effect.channel}'")
        if isinstance(cfg, LogChannel):
            log.info(
                "effect",
                extra={
                    "channel": effect.channel,
                    "idempotency_key": effect.idempotency_key,
                    "transaction_id": effect.transaction_id,
                    "payload": effect.payload,
                },
            )
        elif isinstance(cfg, WebhookChannel):
            await asyncio.to_thread(_post_webhook, cfg, effect)
        else:
            await asyncio.to_thread(_send_email, cfg, effect)
