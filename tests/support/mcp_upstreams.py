"""Real upstream MCP servers for the toolset tests, built on the official `mcp` SDK and
served over streamable HTTP on loopback (uvicorn in a thread of the test process).

* `tracker()`: a ticket tracker (`create_ticket`, `close_ticket`, `search_tickets`,
  `add_comment`, `delete_comment`) keeping its tickets in memory.
* `mailer()`: a mailer (`send_email`).

Both record every call (`calls`: tool, arguments, the `_meta` idempotency key, the
request's HTTP headers and `_meta`) and can be told, through `control`, to answer
`isError` (`fail`), to stall (`stall_s`), to answer a bare HTTP status (`http_status`),
or to go down (`down()`) and come back on the same port (`up()`), keeping their state.
What the test sees is what a real MCP server would have seen: nothing is faked.
"""

# No `from __future__ import annotations` here: the SDK reads the tools' return types
# (nested TypedDicts) to publish their output schemas and structured content.
import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel
from starlette.responses import Response
from typing_extensions import TypedDict

from agenttx.embedded_etcd import free_port

KEY_META = "io.agenttx/idempotency-key"


@dataclass
class Call:
    tool: str
    arguments: dict[str, Any]
    key: str | None
    headers: dict[str, str]
    meta: dict[str, Any]
    at: float


@dataclass
class Control:
    fail: dict[str, str] = field(default_factory=dict)   # tool -> isError message
    stall_s: dict[str, float] = field(default_factory=dict)  # tool -> seconds
    http_status: int | None = None                        # answer tools/call with this
    padding: int = 0                                      # tracker_status: extra text bytes


class Upstream:
    """One MCP server on 127.0.0.1:<port>/mcp; see the module docstring."""

    def __init__(self, name: str, build: Callable[["Upstream", MCPServer], None]) -> None:
        self.name = name
        self._build = build
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.control = Control()
        self.calls: list[Call] = []
        self.lock = threading.Lock()
        self.state: dict[str, Any] = {}
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    # ---- what the tools use ------------------------------------------------------------

    async def record(self, tool: str, arguments: dict[str, Any], ctx: Context) -> None:
        """Record the call, then act on `control` (stall, fail)."""
        rc = ctx.request_context
        meta = dict(rc.meta or {}) if rc.meta else {}
        with self.lock:
            self.calls.append(Call(tool, dict(arguments), meta.get(KEY_META),
                                   {k.lower(): v for k, v in (ctx.headers or {}).items()},
                                   meta, time.time()))
            stall = self.control.stall_s.get(tool, 0.0)
            fail = self.control.fail.get(tool)
        if stall:
            await asyncio.sleep(stall)
        if fail is not None:
            raise ToolError(fail)

    # ---- what the tests use ------------------------------------------------------------

    def calls_to(self, tool: str, **match: Any) -> list[Call]:
        """Calls of `tool` whose arguments include `match`."""
        with self.lock:
            return [c for c in self.calls if c.tool == tool
                    and all(c.arguments.get(k) == v for k, v in match.items())]

    def _app(self) -> Any:
        server = MCPServer(self.name, log_level="WARNING")
        self._build(self, server)
        inner = server.streamable_http_app()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            status = self.control.http_status
            if status is not None and scope["type"] == "http" and scope["method"] == "POST" \
                    and dict(scope["headers"]).get(b"mcp-method") == b"tools/call":
                await Response(status_code=status, content=b"upstream says no")(
                    scope, receive, send)
                return
            await inner(scope, receive, send)
        return app

    def up(self) -> "Upstream":
        config = uvicorn.Config(self._app(), host="127.0.0.1", port=self.port,
                                log_level="warning", lifespan="on", access_log=False,
                                timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True,
                                        name=f"mcp-{self.name}")
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"upstream {self.name} did not start")
            time.sleep(0.02)
        return self

    def down(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=15)
        self._server = self._thread = None

    def __enter__(self) -> "Upstream":
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()


# ---- the ticket tracker ------------------------------------------------------------------

class Ticket(TypedDict):
    id: str
    title: str
    priority: int
    status: str


class Comment(TypedDict):
    id: str
    comments: list[str]


class Found(BaseModel):
    tickets: list[Ticket]


def _tracker_tools(up: Upstream, server: MCPServer) -> None:
    tickets: dict[str, dict[str, Any]] = up.state.setdefault("tickets", {})

    @server.tool()
    async def create_ticket(title: str, priority: int = 3, ctx: Context = None) -> Ticket:  # type: ignore[assignment]
        """Open a ticket in the team's tracker; returns it with its new id."""
        await up.record("create_ticket", {"title": title, "priority": priority}, ctx)
        ticket_id = f"T-{uuid.uuid4().hex[:6]}"
        tickets[ticket_id] = {"id": ticket_id, "title": title, "priority": priority,
                              "status": "open", "comments": []}
        return {"id": ticket_id, "title": title, "priority": priority, "status": "open"}

    @server.tool()
    async def close_ticket(id: str, reason: str = "", ctx: Context = None) -> Ticket:  # type: ignore[assignment]  # noqa: A002
        """Close a ticket."""
        await up.record("close_ticket", {"id": id, "reason": reason}, ctx)
        if id not in tickets:
            raise ToolError(f"no ticket {id}")
        tickets[id]["status"] = "closed"
        t = tickets[id]
        return {"id": id, "title": t["title"], "priority": t["priority"], "status": "closed"}

    @server.tool()
    async def search_tickets(query: str = "", ctx: Context = None) -> Found:  # type: ignore[assignment]
        """Find tickets whose title contains the query."""
        await up.record("search_tickets", {"query": query}, ctx)
        return Found(tickets=[{"id": t["id"], "title": t["title"], "priority": t["priority"],
                               "status": t["status"]}
                              for t in tickets.values() if query in t["title"]])

    @server.tool(structured_output=False)
    async def tracker_status(ctx: Context = None) -> str:  # type: ignore[assignment]
        """How many tickets are open (plain text, no structured content)."""
        await up.record("tracker_status", {}, ctx)
        open_ = sum(1 for t in tickets.values() if t["status"] == "open")
        return f"{open_} open tickets" + " " * up.control.padding

    @server.tool()
    async def add_comment(id: str, text: str, ctx: Context = None) -> Comment:  # type: ignore[assignment]  # noqa: A002
        """Comment on a ticket."""
        await up.record("add_comment", {"id": id, "text": text}, ctx)
        if id not in tickets:
            raise ToolError(f"no ticket {id}")
        tickets[id]["comments"].append(text)
        return {"id": id, "comments": list(tickets[id]["comments"])}

    @server.tool()
    async def delete_comment(id: str, text: str, ctx: Context = None) -> Comment:  # type: ignore[assignment]  # noqa: A002
        """Remove a comment from a ticket (absent: nothing to do)."""
        await up.record("delete_comment", {"id": id, "text": text}, ctx)
        comments = tickets.get(id, {}).get("comments", [])
        if text in comments:
            comments.remove(text)
        return {"id": id, "comments": list(comments)}


def tracker() -> Upstream:
    return Upstream("tracker", _tracker_tools)


def ticket(up: Upstream, ticket_id: str) -> dict[str, Any]:
    return dict(up.state["tickets"][ticket_id])


# ---- the mailer ---------------------------------------------------------------------------

class Sent(TypedDict):
    message_id: str


def _mailer_tools(up: Upstream, server: MCPServer) -> None:
    @server.tool()
    async def send_email(to: str, subject: str, body: str = "", ctx: Context = None) -> Sent:  # type: ignore[assignment]
        """Send an email."""
        await up.record("send_email", {"to": to, "subject": subject, "body": body}, ctx)
        return {"message_id": f"<{uuid.uuid4().hex}@mailer>"}


def mailer() -> Upstream:
    return Upstream("mailer", _mailer_tools)


@dataclass
class Upstreams:
    tracker: Upstream
    mailer: Upstream


def running() -> Iterator[Upstreams]:
    """Both servers up for a fixture's lifetime."""
    with tracker() as t, mailer() as m:
        yield Upstreams(t, m)




# ---- how the tests declare them ------------------------------------------------------------

def declaration(ups: Upstreams, *, namespace: str = "default", timeout_s: float = 2.0,
                headers: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """The toolsets file the tests give the replicas (`--toolsets-file`): the tracker as
    `tickets` (create_ticket: saga undone from its output; add_comment: saga undone from
    its arguments; search_tickets: read) and the mailer as `mail` (send_email: deferred)."""
    def upstream(up: Upstream) -> dict[str, Any]:
        doc: dict[str, Any] = {"url": up.url, "timeoutSeconds": timeout_s}
        if headers:
            doc["headers"] = headers
        return doc
    return {"toolsets": [
        {"namespace": namespace, "name": "tickets", "spec": {
            "upstream": upstream(ups.tracker), "prefix": "tickets",
            "tools": [
                {"name": "create_ticket", "kind": "saga",
                 "compensate": {"tool": "close_ticket",
                                "arguments": {"id": "${output.id}",
                                              "reason": "rolled back by AgentTx"}}},
                {"name": "add_comment", "kind": "saga",
                 "compensate": {"tool": "delete_comment",
                                "arguments": {"id": "${arguments.id}",
                                              "text": "${arguments.text}"}}},
                {"name": "search_tickets", "kind": "read"},
                {"name": "tracker_status", "kind": "read"},
            ]}},
        {"namespace": namespace, "name": "mail", "spec": {
            "upstream": upstream(ups.mailer), "prefix": "mail",
            "tools": [{"name": "send_email", "kind": "deferred"}]}},
    ]}


__all__ = ["KEY_META", "Call", "Control", "Upstream", "Upstreams", "declaration", "mailer",
           "running", "ticket", "tracker"]
