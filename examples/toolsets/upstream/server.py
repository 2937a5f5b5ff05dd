"""A small ticket tracker and a mailer as MCP servers (the official `mcp` SDK, streamable
HTTP): the upstream of examples/toolsets/tickets.yaml and mail.yaml.

    tickets  http://0.0.0.0:$TICKETS_PORT/mcp  create_ticket, close_ticket, search_tickets,
                                               add_comment, delete_comment
    mail     http://0.0.0.0:$MAIL_PORT/mcp     send_email (records each message with its
                                               idempotency key; never really sends)

With $TICKETS_AUTHORIZATION set, the tracker answers HTTP 401 to any request whose
Authorization header is not exactly that value (the example Deployment takes it from the
same Secret key the AgentTxToolset names). State is in memory; every call is logged on
stdout, one line each, so `kubectl logs` shows what AgentTx did (e.g. the close_ticket
of a rolled-back step). It stands in for a team's real MCP servers: nothing in it knows
AgentTx.

examples/toolsets/upstream.yaml carries a copy of this file in a ConfigMap (a test
checks they are the same) and runs it in python:3.12-slim, installing the SDK at start.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from typing_extensions import TypedDict

IDEMPOTENCY_META = "io.agenttx/idempotency-key"


class Ticket(TypedDict):
    id: str
    title: str
    priority: int
    status: str


class Found(TypedDict):
    tickets: list[Ticket]


class Comments(TypedDict):
    id: str
    comments: list[str]


class Sent(TypedDict):
    message_id: str


def log(server: str, tool: str, ctx: Context, **details: Any) -> None:
    meta = ctx.request_context.meta or {}
    key = meta.get(IDEMPOTENCY_META) if isinstance(meta, dict) else None
    fields = " ".join(f"{k}={v!r}" for k, v in details.items())
    print(f"{server} {tool} {fields} idempotency_key={key!r}", flush=True)


def tracker() -> MCPServer:
    server = MCPServer("tickets", log_level="WARNING")
    tickets: dict[str, dict[str, Any]] = {}
    ids = itertools.count(1)

    def find(ticket_id: str) -> dict[str, Any]:
        if ticket_id not in tickets:
            raise ToolError(f"no ticket {ticket_id}")
        return tickets[ticket_id]

    def public(ticket: dict[str, Any]) -> Ticket:
        return Ticket(id=ticket["id"], title=ticket["title"], priority=ticket["priority"],
                      status=ticket["status"])

    @server.tool(description="Open a ticket in the team's tracker; returns it with its new id.")
    def create_ticket(title: str, ctx: Context, priority: int = 3) -> Ticket:
        ticket = {"id": f"T-{next(ids)}", "title": title, "priority": priority,
                  "status": "open", "comments": []}
        tickets[ticket["id"]] = ticket
        log("tickets", "create_ticket", ctx, id=ticket["id"], title=title)
        return public(ticket)

    @server.tool(description="Close a ticket.")
    def close_ticket(id: str, ctx: Context, reason: str = "") -> Ticket:
        ticket = find(id)
        ticket["status"] = "closed"
        log("tickets", "close_ticket", ctx, id=id, reason=reason)
        return public(ticket)

    @server.tool(description="Find tickets whose title contains the query.")
    def search_tickets(ctx: Context, query: str = "") -> Found:
        found = [public(t) for t in tickets.values() if query in t["title"]]
        log("tickets", "search_tickets", ctx, query=query, found=len(found))
        return Found(tickets=found)

    @server.tool(description="Comment on a ticket.")
    def add_comment(id: str, text: str, ctx: Context) -> Comments:
        ticket = find(id)
        ticket["comments"].append(text)
        log("tickets", "add_comment", ctx, id=id, text=text)
        return Comments(id=id, comments=list(ticket["comments"]))

    @server.tool(description="Remove a comment from a ticket (absent: nothing to do).")
    def delete_comment(id: str, text: str, ctx: Context) -> Comments:
        comments = tickets.get(id, {}).get("comments", [])
        if text in comments:
            comments.remove(text)
        log("tickets", "delete_comment", ctx, id=id, text=text)
        return Comments(id=id, comments=list(comments))

    return server


def mailer() -> MCPServer:
    server = MCPServer("mail", log_level="WARNING")
    ids = itertools.count(1)

    @server.tool(description="Send an email.")
    def send_email(to: str, subject: str, ctx: Context, body: str = "") -> Sent:
        message_id = f"<M-{next(ids)}@example-mailer>"
        log("mail", "send_email", ctx, to=to, subject=subject, message_id=message_id)
        return Sent(message_id=message_id)

    return server


class RequireAuthorization:
    """ASGI middleware: HTTP 401 unless Authorization is exactly `expected`."""

    def __init__(self, app: Any, expected: str) -> None:
        self.app, self.expected = app, expected

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            if headers.get(b"authorization", b"").decode("latin-1") != self.expected:
                body = b'{"error": "unauthorized"}'
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


async def main() -> None:
    host = os.environ.get("HOST", "0.0.0.0")
    # `host` also decides the SDK's DNS-rebinding protection: on 0.0.0.0 (in a pod, reached
    # as tickets-upstream:8080) it is off; on 127.0.0.1 only local Host headers pass.
    tickets_app: Any = tracker().streamable_http_app(json_response=True, host=host)
    expected = os.environ.get("TICKETS_AUTHORIZATION", "").rstrip("\r\n")
    if expected:
        tickets_app = RequireAuthorization(tickets_app, expected)
    servers = [
        uvicorn.Server(uvicorn.Config(tickets_app, host=host,
                                      port=int(os.environ.get("TICKETS_PORT", "8080")),
                                      log_level="warning")),
        uvicorn.Server(uvicorn.Config(mailer().streamable_http_app(json_response=True, host=host),
                                      host=host, port=int(os.environ.get("MAIL_PORT", "8081")),
                                      log_level="warning")),
    ]
    print(f"tickets and mail MCP servers starting on {host} "
          f"(tickets authorization {'required' if expected else 'not required'})",
          file=sys.stderr, flush=True)
    await asyncio.gather(*(s.serve() for s in servers))


if __name__ == "__main__":
    asyncio.run(main())
