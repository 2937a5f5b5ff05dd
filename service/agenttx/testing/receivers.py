"""A real HTTP server on loopback that hands every POST to a callback: the receiving end
of webhook effects in tests, benchmarks and demos.

Why one: effects must be judged by what a real receiver got over real HTTP, and each
user of a receiver (the test suite, the outcomes benchmark, the dashboard demo) differs
only in what it records and what it answers. That is the callback; the server, its
thread and its shutdown are here once.

    from agenttx.testing.receivers import PostReceiver

    got = []
    with PostReceiver(lambda handler, body: got.append(body) or 200) as rx:
        ...  # effects configured with url=rx.url

What it must never do: listen beyond 127.0.0.1, or log requests to stderr.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

# (the request's handler: .path, .headers; the body) -> the status to answer, or DROP
OnPost = Callable[[BaseHTTPRequestHandler, bytes], int]
# What `on_post` returns to close the connection without answering at all (a receiver
# that crashed mid-request, a proxy that dropped it).
DROP = 0


class PostReceiver:
    """POSTs to `url` are read whole and answered with `on_post(handler, body)`'s status
    and an empty body (`DROP`: the connection is closed without an answer). `server` is
    the `ThreadingHTTPServer` (its handler class is this receiver's own, so a test may
    wrap `server.RequestHandlerClass.do_POST`)."""

    def __init__(self, on_post: OnPost, path: str = "/", *, name: str = "post-receiver") -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status = on_post(self, body)
                if status == DROP:
                    self.close_connection = True  # closed with nothing written
                    return
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{path}"
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True, name=name)

    def start(self) -> Self:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
