"""An API gateway in front of a test upstream (support.mcp_upstreams): records the
headers of every HTTP request the upstream receives (tools/list included, which the
upstream's own `calls` do not see) and, with `required`, answers HTTP 401 to a request
without exactly those headers, as an upstream behind an authenticating gateway would.

The operator's tests need both: that a Secret-backed header reached the upstream on the
operator's tools/list, and what a wrong one looks like in the toolset's status.
"""

from __future__ import annotations

import threading
from typing import Any

from support.mcp_upstreams import Upstream


class Gate:
    def __init__(self, required: dict[str, str]) -> None:
        self.required = dict(required)
        self.requests: list[dict[str, str]] = []
        self.lock = threading.Lock()

    def saw(self, name: str, value: str) -> bool:
        """Whether any request carried header `name` with exactly `value`."""
        with self.lock:
            return any(r.get(name.lower()) == value for r in self.requests)

    def wrap(self, app: Any) -> Any:
        async def gated(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                           for k, v in scope.get("headers", [])}
                with self.lock:
                    self.requests.append(headers)
                    missing = [n for n, v in self.required.items() if headers.get(n.lower()) != v]
                if missing:
                    body = b'{"error": "unauthorized"}'
                    await send({"type": "http.response.start", "status": 401,
                                "headers": [(b"content-type", b"application/json"),
                                            (b"content-length", str(len(body)).encode())]})
                    await send({"type": "http.response.body", "body": body})
                    return
            await app(scope, receive, send)
        return gated


def gate(upstream: Upstream, required: dict[str, str] | None = None) -> Gate:
    """Put a Gate in front of `upstream` (before it is started; it stays across down/up)."""
    g = Gate(required or {})
    build = upstream._app
    upstream._app = lambda: g.wrap(build())  # type: ignore[method-assign]
    return g
