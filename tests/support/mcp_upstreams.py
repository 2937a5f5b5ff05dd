"""Real MCP servers for toolset tests: a ticket tracker and a mailer, built with the
official `mcp` SDK (`MCPServer`, streamable HTTP) and served by uvicorn on loopback, each
in its own thread and event loop (never the test's loop).

    with TicketTracker(required_headers={"Authorization": "Bearer s3cr3t"}) as tickets:
        tickets.url                     # http://127.0.0.1:<port>/mcp
        tickets.tickets                 # {"T-1": {"id": "T-1", "status": "open", ...}}
        tickets.calls_of("close_ticket")
    with Mailer() as mail:
        mail.fail["send_email"] = "mailbox full"   # answer isError with this text
        mail.stall["send_email"] = 5.0              # sleep before answering
        mail.stop(); mail.start()                   # down, then up again on the same port

Every tool call is recorded as a `Call` (tool, arguments, the `io.agenttx/idempotency-key`
of its `_meta`, and the HTTP headers of the request that carried it); `requests` records
the headers of every HTTP request (tools/list included), so a test can prove that a
Secret-backed header reached the upstream. With `required_headers`, a request without
exactly those headers is refused with HTTP 401 before the MCP layer sees it, as an
upstream behind an API gateway would.

What it must never do: share state between instances, or depend on AgentTx (it is the
outside world AgentTx talks to).
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import socket
import threading
import time
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from starlette.types import ASGIApp, Receive, Scope, Send
from typing_extensions import TypedDict  # pydantic needs it for nested TypedDicts on 3.11

IDEMPOTENCY_META = "io.agenttx/idempotency-key"
MCP_PATH = "/mcp"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Call:
    """One tools/call the upstream received (whether it answered or failed)."""

    tool: str
    arguments: dict[str, Any]
    idempotency_key: str | None
    headers: dict[str, str] = field(repr=False)


# Outputs as TypedDicts, so the SDK publishes an outputSchema and answers with the object
# itself as structuredContent (a plain dict return would be wrapped as {"result": ...}).
class TicketRef(TypedDict):
    id: str
    title: str
    status: str


class Closed(TypedDict):
    id: str
    status: str


class Found(TypedDict):
    tickets: list[TicketRef]


class Commented(TypedDict):
    ticket: str
    comment_id: str


class Uncommented(TypedDict):
    ticket: str
    deleted: str


class Sent(TypedDict):
    message_id: str
    to: str


class _RequireHeaders:
    """ASGI middleware: record each HTTP request's headers; refuse (401) a request that
    lacks one of `required` (exact value)."""

    def __init__(self, app: ASGIApp, upstream: Upstream) -> None:
        self.app = app
        self.upstream = upstream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        with self.upstream.lock:
            self.upstream.requests.append(headers)
        missing = [name for name, value in self.upstream.required_headers.items()
                   if headers.get(name.lower()) != value]
        if missing:
            body = b'{"error": "unauthorized"}'
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)


class Upstream:
    """An `MCPServer` served over streamable HTTP on 127.0.0.1, in a thread.

    Subclasses register their tools in `_register`, wrapping each handler with `_tool`
    so that calls are recorded and `fail` / `stall` apply."""

    name = "upstream"

    def __init__(self, *, required_headers: Mapping[str, str] | None = None,
                 port: int | None = None, stateless: bool = False) -> None:
        self.required_headers = dict(required_headers or {})
        self.port = port or _free_port()
        self.stateless = stateless
        self.lock = threading.Lock()
        self.calls: list[Call] = []
        self.requests: list[dict[str, str]] = []
        self.fail: dict[str, str] = {}       # tool -> isError text
        self.stall: dict[str, float] = {}    # tool -> seconds to sleep before answering
        self.server = MCPServer(self.name, log_level="WARNING")
        self._register(self.server)
        self._uvicorn: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{MCP_PATH}"

    # ---- tools ---------------------------------------------------------------------

    def _register(self, server: MCPServer) -> None:
        raise NotImplementedError

    def _tool(self, name: str, fn: Callable[..., Awaitable[Any]], description: str) -> None:
        """Register `fn(**arguments)` as tool `name`, recorded, failing and stalling on
        request. `fn`'s signature (type hints) becomes the tool's input schema."""
        upstream = self

        async def handler(ctx: Context, **arguments: Any) -> Any:
            meta = ctx.request_context.meta or {}
            key = meta.get(IDEMPOTENCY_META) if isinstance(meta, Mapping) else None
            headers = dict(ctx.headers or {})
            with upstream.lock:
                upstream.calls.append(Call(name, dict(arguments), key,
                                           {k.lower(): v for k, v in headers.items()}))
                delay = upstream.stall.get(name, 0.0)
                failure = upstream.fail.get(name)
            if delay:
                await asyncio.sleep(delay)
            if failure is not None:
                raise ToolError(failure)
            return await fn(**arguments)

        handler.__name__ = handler.__qualname__ = name
        signature = _with_context(fn)
        handler.__signature__ = signature  # type: ignore[attr-defined]
        handler.__annotations__ = {
            **{p.name: p.annotation for p in signature.parameters.values()},
            "return": signature.return_annotation}
        self.server.add_tool(handler, name=name, description=description)

    def calls_of(self, tool: str) -> list[Call]:
        with self.lock:
            return [c for c in self.calls if c.tool == tool]

    # ---- lifecycle -----------------------------------------------------------------

    def start(self) -> Upstream:
        """Serve (again) on `self.port`; returns once it accepts connections."""
        assert self._thread is None, "already running"
        app = _RequireHeaders(self.server.streamable_http_app(
            streamable_http_path=MCP_PATH, stateless_http=self.stateless, json_response=True),
            self)
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                lifespan="on")
        self._uvicorn = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._uvicorn.run, name=f"mcp-{self.name}",
                                         daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._uvicorn.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"{self.name} upstream did not start on port {self.port}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} upstream not listening after 20 s")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """Go down: stop accepting connections and end open streams."""
        if self._uvicorn is None or self._thread is None:
            return
        self._uvicorn.should_exit = True
        self._thread.join(20)
        assert not self._thread.is_alive(), f"{self.name} upstream did not stop"
        self._uvicorn = None
        self._thread = None

    def __enter__(self) -> Upstream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _with_context(fn: Callable[..., Any]) -> inspect.Signature:
    """`fn`'s signature, annotations resolved, with a trailing `ctx: Context` (the SDK
    injects it and leaves it out of the input schema; the return annotation becomes the
    output schema)."""
    hints = typing.get_type_hints(fn)
    sig = inspect.signature(fn)
    params = [p.replace(annotation=hints.get(p.name, p.annotation))
              for p in sig.parameters.values()]
    params.append(inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context))
    return sig.replace(parameters=params, return_annotation=hints.get("return", Any))


class TicketTracker(Upstream):
    """A ticket tracker: create_ticket, close_ticket, search_tickets, add_comment and
    delete_comment. Tickets live in `tickets` (id -> ticket), ids are T-1, T-2, ..."""

    name = "tickets"

    def __init__(self, **kwargs: Any) -> None:
        self.tickets: dict[str, dict[str, Any]] = {}
        self._ids = itertools.count(1)
        self._comment_ids = itertools.count(1)
        super().__init__(**kwargs)

    def _register(self, server: MCPServer) -> None:
        async def create_ticket(title: str, body: str = "") -> TicketRef:
            ticket = {"id": f"T-{next(self._ids)}", "title": title, "body": body,
                      "status": "open", "comments": [], "close_reason": None}
            with self.lock:
                self.tickets[ticket["id"]] = ticket
            return TicketRef(id=ticket["id"], title=title, status="open")

        async def close_ticket(id: str, reason: str = "") -> Closed:
            with self.lock:
                ticket = self.tickets.get(id)
                if ticket is None:
                    raise ToolError(f"ticket {id} does not exist")
                ticket["status"], ticket["close_reason"] = "closed", reason
            return Closed(id=id, status="closed")

        async def search_tickets(query: str = "", status: str = "") -> Found:
            with self.lock:
                found = [TicketRef(id=t["id"], title=t["title"], status=t["status"])
                         for t in self.tickets.values()
                         if query.lower() in t["title"].lower()
                         and (not status or t["status"] == status)]
            return Found(tickets=found)

        async def add_comment(id: str, text: str) -> Commented:
            with self.lock:
                ticket = self.tickets.get(id)
                if ticket is None:
                    raise ToolError(f"ticket {id} does not exist")
                comment_id = f"C-{next(self._comment_ids)}"
                ticket["comments"].append({"id": comment_id, "text": text})
            return Commented(ticket=id, comment_id=comment_id)

        async def delete_comment(id: str, comment_id: str) -> Uncommented:
            with self.lock:
                ticket = self.tickets.get(id)
                if ticket is None:
                    raise ToolError(f"ticket {id} does not exist")
                ticket["comments"] = [c for c in ticket["comments"] if c["id"] != comment_id]
            return Uncommented(ticket=id, deleted=comment_id)

        self._tool("create_ticket", create_ticket, "Open a ticket; returns its id.")
        self._tool("close_ticket", close_ticket, "Close a ticket with a reason.")
        self._tool("search_tickets", search_tickets,
                   "Tickets whose title contains the query, optionally with a status.")
        self._tool("add_comment", add_comment, "Comment on a ticket; returns the comment id.")
        self._tool("delete_comment", delete_comment, "Delete a comment of a ticket.")


class Mailer(Upstream):
    """A mailer: send_email. Every accepted message is in `sent` with its idempotency
    key; `fail` / `stall` / `stop` make it refuse, hang or go down."""

    name = "mail"

    def __init__(self, **kwargs: Any) -> None:
        self.sent: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        super().__init__(**kwargs)

    def _register(self, server: MCPServer) -> None:
        async def send_email(to: str, subject: str, body: str = "") -> Sent:
            message_id = f"M-{next(self._ids)}"
            with self.lock:
                self.sent.append({"id": message_id, "to": to, "subject": subject,
                                  "body": body})
            return Sent(message_id=message_id, to=to)

        self._tool("send_email", send_email, "Send an email.")

    def keys(self) -> list[str | None]:
        """The idempotency key of every send_email call received, in order."""
        return [c.idempotency_key for c in self.calls_of("send_email")]


__all__ = ["IDEMPOTENCY_META", "MCP_PATH", "Call", "Mailer", "TicketTracker", "Upstream"]
