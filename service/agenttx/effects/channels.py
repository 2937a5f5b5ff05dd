"""Effect channels: where a committed effect goes, configured rather than hard-coded.

Why this module exists: `effect.stage` must reject an unknown channel at stage time and
the outbox must deliver to whatever the operator configured in `AGENTTX_EFFECT_CHANNELS`
(JSON object, name -> `{"kind": "log" | "webhook" | "email", ...}`). The `log` channel is
always on, so a deployment with nothing configured can still stage and commit effects.

Delivery contract: `ChannelRegistry.deliver` returns only when the receiver confirmed
(webhook 2xx, SMTP accepted the message, log line written) and raises `DeliveryError`
otherwise, saying whether the refusal is permanent (effects.delivery has the rules: HTTP
4xx other than 408/425/429, SMTP 5xx, a payload or key the channel cannot encode) or
worth another try. Every delivery carries the effect's idempotency key (HTTP header
`Idempotency-Key`; SMTP `Message-ID` derived from it plus `X-Idempotency-Key`) so a
receiver can dedupe the redeliveries an at-least-once outbox may make.

Webhooks go out on one `httpx2.AsyncClient` per channel (a maintained asyncio HTTP
client): connections are reused between deliveries, the connect and read timeouts come
from the channel's config, no thread per POST. `ChannelRegistry.aclose()` closes them
(the server does on shutdown). Proxies from the environment are not used: a webhook
goes where its URL says. SMTP stays on the standard library's `smtplib`, in a worker
thread (`asyncio.to_thread`) so the event loop never waits on it: one connection per
message, which mail is fine with, and no further dependency.

What it must never do: touch etcd, retry on its own (the outbox decides when to try
again), or put secrets (passwords, header values, URL credentials and query strings) in
error messages.
"""

from __future__ import annotations

import asyncio
import hashlib
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

import httpx2
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from ..contracts.outbox import idempotency_key_problem
from .delivery import DeliveryError, http_status_is_permanent, smtp_code_is_permanent

log = logging.getLogger("agenttx.effects")

CHANNEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# Read at most this much of a webhook's response body (we only need the status).
_MAX_RESPONSE_BYTES = 64 * 1024
# Connections one webhook channel keeps open to its receiver (httpx2's defaults, named).
_WEBHOOK_LIMITS = httpx2.Limits(max_connections=100, max_keepalive_connections=20,
                                keepalive_expiry=5.0)


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
    timeout_s: float = Field(5.0, gt=0, le=300, description="read (and write) timeout: how "
                             "long to wait for the receiver's answer")
    connect_timeout_s: float | None = Field(None, gt=0, le=300, description="timeout to "
                                            "open a connection (default: timeout_s)")
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


def _sendable_key(effect: Effect) -> None:
    """A key that cannot go into a header is refused for good (keys are checked when
    staged; this catches entries committed before that check existed)."""
    problem = idempotency_key_problem(effect.idempotency_key)
    if problem is not None:
        raise DeliveryError(f"idempotency key cannot be sent in a header: {problem}",
                            permanent=True)


def _refused(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(8):  # httpx2 -> httpcore2 -> anyio's OSError -> the socket's error
        if seen is None:
            return False
        if isinstance(seen, ConnectionRefusedError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


# ---- webhook: one asyncio HTTP client per channel ------------------------------------------

class WebhookSender:
    """POSTs effects to one webhook channel over a client kept for the channel's
    lifetime (connection reuse).

    The client is built here, when the channels are configured (start-up), not at the
    first delivery: building one loads a CA bundle, which costs hundreds of milliseconds
    of blocked event loop and would eat the first delivery's timeout. An http:// channel
    gets no TLS context at all; an https:// one verifies the receiver against the system's
    CAs (`ssl.create_default_context`)."""

    def __init__(self, cfg: WebhookChannel) -> None:
        self.cfg = cfg
        parts = urllib.parse.urlsplit(cfg.url)
        # for messages: scheme, host and port only (never credentials, path or query)
        self.where = f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}"
        self._verify: ssl.SSLContext | bool = \
            ssl.create_default_context() if parts.scheme == "https" else False
        self._client: httpx2.AsyncClient | None = self._new_client()

    def _new_client(self) -> httpx2.AsyncClient:
        cfg = self.cfg
        return httpx2.AsyncClient(
            timeout=httpx2.Timeout(cfg.timeout_s, connect=cfg.connect_timeout_s or
                                   cfg.timeout_s),
            limits=_WEBHOOK_LIMITS, follow_redirects=False, trust_env=False,
            verify=self._verify)

    def client(self) -> httpx2.AsyncClient:
        if self._client is None:  # closed (shutdown) and used again
            self._client = self._new_client()
        return self._client

    async def post(self, effect: Effect) -> None:
        _sendable_key(effect)
        try:
            body = webhook_body(effect)
        except (UnicodeError, ValueError) as exc:
            raise DeliveryError(f"the payload cannot be encoded as UTF-8 JSON "
                                f"({type(exc).__name__})", permanent=True) from exc
        headers = {**self.cfg.headers, "Content-Type": "application/json",
                   "Idempotency-Key": effect.idempotency_key}
        where, timeout = self.where, self.cfg.timeout_s
        try:
            async with self.client().stream("POST", self.cfg.url, content=body,
                                            headers=headers) as resp:
                read = 0
                async for chunk in resp.aiter_raw():  # the status is what counts
                    read += len(chunk)
                    if read >= _MAX_RESPONSE_BYTES:
                        break
        except httpx2.TimeoutException as exc:
            which = "connecting" if isinstance(exc, httpx2.ConnectTimeout | httpx2.PoolTimeout) \
                else "waiting for the answer"
            raise DeliveryError(f"{where} timed out after {timeout:g}s ({which})") from exc
        except httpx2.ConnectError as exc:
            if _refused(exc):
                raise DeliveryError(f"{where} refused the connection") from exc
            raise DeliveryError(f"{where} could not be reached: {exc}") from exc
        except httpx2.RemoteProtocolError as exc:
            raise DeliveryError(f"{where} dropped the connection: {exc}") from exc
        except httpx2.LocalProtocolError as exc:
            # names no header value: the channel's headers may hold credentials
            raise DeliveryError(f"{where}: the request cannot be encoded as HTTP (a header "
                                "of the channel or the effect is not valid)",
                                permanent=True) from exc
        except (httpx2.TransportError, OSError) as exc:
            raise DeliveryError(f"{where} failed: {type(exc).__name__}: {exc}") from exc
        except UnicodeError as exc:  # a header value outside latin-1
            raise DeliveryError(f"{where}: the request cannot be encoded as HTTP "
                                f"({type(exc).__name__})", permanent=True) from exc
        if not 200 <= resp.status_code < 300:
            raise DeliveryError(
                f"{where} answered HTTP {resp.status_code} {resp.reason_phrase}".rstrip(),
                permanent=http_status_is_permanent(resp.status_code))

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


# ---- email: smtplib in a worker thread ------------------------------------------------------

def _smtp_reply(code: int, message: bytes | str) -> str:
    text = message.decode(errors="replace") if isinstance(message, bytes) else str(message)
    first = " ".join(text.split())[:120]
    return f"{code} {first}".rstrip()


def _send_email(cfg: EmailChannel, effect: Effect) -> None:
    _sendable_key(effect)
    try:
        mail = email_payload(effect.payload)
    except ValueError as exc:
        raise DeliveryError(str(exc), permanent=True) from exc
    where = f"smtp://{cfg.host}:{cfg.port}"
    try:
        msg = EmailMessage()
        msg["From"] = cfg.from_addr
        msg["To"] = ", ".join(mail.to)
        msg["Subject"] = mail.subject
        msg["Date"] = formatdate(localtime=False, usegmt=True)
        msg["Message-ID"] = message_id(effect.idempotency_key)
        msg["X-Idempotency-Key"] = effect.idempotency_key
        msg["X-AgentTx-Transaction-Id"] = effect.transaction_id
        msg.set_content(mail.body)
        msg.as_bytes()  # fails here, not half-way through an SMTP session
    except (UnicodeError, ValueError, TypeError) as exc:
        raise DeliveryError(f"the message cannot be encoded ({type(exc).__name__})",
                            permanent=True) from exc
    try:
        with smtplib.SMTP(cfg.host, cfg.port, timeout=cfg.timeout_s) as smtp:
            if cfg.starttls:
                smtp.starttls(context=ssl.create_default_context())
            if cfg.username:
                password = cfg.password.get_secret_value() if cfg.password else ""
                smtp.login(cfg.username, password)
            refused = smtp.send_message(msg, from_addr=cfg.from_addr, to_addrs=mail.to)
    except smtplib.SMTPRecipientsRefused as exc:
        codes = sorted({code for code, _ in exc.recipients.values()})
        raise DeliveryError(f"{where} refused every recipient ({', '.join(map(str, codes))})",
                            permanent=all(smtp_code_is_permanent(c) for c in codes)) from exc
    except smtplib.SMTPResponseException as exc:
        raise DeliveryError(f"{where} answered {_smtp_reply(exc.smtp_code, exc.smtp_error)}",
                            permanent=smtp_code_is_permanent(exc.smtp_code)) from exc
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
        self._webhooks = {name: WebhookSender(cfg) for name, cfg in self._channels.items()
                          if isinstance(cfg, WebhookChannel)}

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
        """Deliver one effect; returns only on a confirmed delivery, else DeliveryError.

        A channel this replica does not know is a transient failure: channel configs
        change with a rolling restart, and another replica (or this one, restarted) may
        know it. The entry stays visible in the outbox metrics meanwhile."""
        cfg = self._channels.get(effect.channel)
        if cfg is None:
            raise DeliveryError(f"unknown channel '{effect.channel}' (not configured on this "
                                "replica)")
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
            await self._webhooks[effect.channel].post(effect)
        else:
            await asyncio.to_thread(_send_email, cfg, effect)

    async def aclose(self) -> None:
        """Close the webhook channels' HTTP clients (their pooled connections)."""
        for sender in self._webhooks.values():
            await sender.aclose()
