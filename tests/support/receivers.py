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
    """A loopback HTTP server recording every POST; `status` sets what it answers.

    `script(key, 429, 503, DROP, ...)` makes the POSTs carrying that Idempotency-Key
    answer those statuses in turn (`agenttx.testing.receivers.DROP`: close the connection
    without answering), then `status` again. Each recorded request notes what it was
    answered (`answer`) and the client's address (`peer`: one per connection)."""

    def __init__(self) -> None:
        self.status = 200
        self.requests: list[dict[str, Any]] = []
        self.scripts: dict[str, list[int]] = {}
        self.lock = threading.Lock()
        super().__init__(self._on_post, "/in", name="test-webhook")

    def script(self, key: str, *answers: int) -> None:
        with self.lock:
            self.scripts[key] = list(answers)

    def _on_post(self, handler: BaseHTTPRequestHandler, body: bytes) -> int:
        with self.lock:
            key = handler.headers.get("Idempotency-Key", "")
            queued = self.scripts.get(key)
            answer = queued.pop(0) if queued else self.status
            self.requests.append({"path": handler.path, "headers": dict(handler.headers.items()),
                                  "body": body, "answer": answer,
                                  "peer": handler.client_address})
            return answer

    def answers(self, key: str) -> list[int]:
        """What the POSTs carrying `key` were answered, in order (DROP = 0)."""
        with self.lock:
            return [r["answer"] for r in self.requests
                    if r["headers"].get("Idempotency-Key") == key]

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


