"""Real loopback receivers for effects: an HTTP server and an SMTP server (aiosmtpd)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from agenttx.embedded_etcd import free_port
from agenttx.testing.receivers import PostReceiver


class WebhookReceiver(PostReceiver):
    """A loopback HTTP server recording every POST; `status` sets what it answers."""

    def __init__(self) -> None:
        self.status = 200
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        super().__init__(self._on_post, "/in", name="test-webhook")

    def _on_post(self, handler: BaseHTTPRequestHandler, body: bytes) -> int:
        with self.lock:
            self.requests.append(
                {"path": handler.path, "headers": dict(handler.headers.items()), "body": body})
            return self.status

    def keys(self) -> Counter[str]:
        """POSTs received per Idempotency-Key (whatever the receiver answered)."""
        with self.lock:
            return Counter(r["headers"]["Idempotency-Key"] for r in self.requests)


@pytest.fixture
def webhook() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as rx:
        yield rx


@pytest.fixture(scope="module")
def hooks() -> Iterator[WebhookReceiver]:
    """One webhook receiver shared by a test module."""
    with WebhookReceiver() as rx:
        yield rx


class SmtpSink:
    def __init__(self) -> None:
        self.envelopes: list[Any] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        self.envelopes.append(envelope)
        return "250 OK"


@pytest.fixture
def smtp() -> Iterator[tuple[SmtpSink, int]]:
    sink = SmtpSink()
    port = free_port()
    controller = Controller(sink, hostname="127.0.0.1", port=port)
    controller.start()
    yield sink, port
    controller.stop()


