"""Real loopback receivers for effects: an HTTP server and an SMTP server (aiosmtpd)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from agenttx.store.embedded import free_port


class WebhookReceiver:
    """A loopback HTTP server recording every POST; `status` sets what it answers."""

    def __init__(self) -> None:
        self.status = 200
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver.lock:
                    receiver.requests.append(
                        {"path": self.path, "headers": dict(self.headers.items()), "body": body}
                    )
                    status = receiver.status
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/in"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def keys(self) -> Counter[str]:
        """POSTs received per Idempotency-Key (whatever the receiver answered)."""
        with self.lock:
            return Counter(r["headers"]["Idempotency-Key"] for r in self.requests)


@pytest.fixture
def webhook() -> Iterator[WebhookReceiver]:
    rx = WebhookReceiver()
    rx.thread.start()
    yield rx
    rx.server.shutdown()
    rx.server.server_close()


@pytest.fixture(scope="module")
def hooks() -> Iterator[WebhookReceiver]:
    """One webhook receiver shared by a test module."""
    rx = WebhookReceiver()
    rx.thread.start()
    yield rx
    rx.server.shutdown()
    rx.server.server_close()


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


