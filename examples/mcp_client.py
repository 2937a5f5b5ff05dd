"""`agenttx mcp` wired into an MCP client: the `mcp` SDK's own client session.

    .venv/bin/python examples/mcp_client.py --target 127.0.0.1:50051      # spawns it (stdio)
    .venv/bin/python examples/mcp_client.py --url http://127.0.0.1:8000/mcp   # a running one

This is what an MCP host (Claude Desktop, an IDE, your own agent) does: list the tools,
call them, and read each result as the model would. The server keeps the transaction
per session, so the calls carry no step ids; a failed step comes back with `isError`
and text that says what to do next.
"""

from __future__ import annotations

import argparse
import sys
import uuid

import anyio
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult, TextContent


def show(name: str, result: CallToolResult) -> None:
    flag = "isError" if result.is_error else "ok"
    block = result.content[0]
    text = block.text if isinstance(block, TextContent) else repr(block)
    print(f"{name} [{flag}]\n    " + "\n    ".join(text.splitlines()))


async def run(server: StdioServerParameters | str) -> None:
    key = f"greeting-{uuid.uuid4().hex[:6]}"
    # mode="legacy": the initialize handshake, i.e. a session (stdio: the connection;
    # HTTP: Mcp-Session-Id). Under the stateless revision, pass the handle instead.
    async with Client(server, mode="legacy") as mcp:
        tools = (await mcp.list_tools()).tools
        print("tools:", ", ".join(t.name for t in tools))
        show("kv_put", await mcp.call_tool("kv_put", {"key": key, "value": "hello"}))
        show("kv_get (typo in the key)", await mcp.call_tool("kv_get", {"key": key + "x"}))
        show("kv_get", await mcp.call_tool("kv_get", {"key": key}))
        show("agenttx_status", await mcp.call_tool("agenttx_status", {}))
        show("agenttx_commit", await mcp.call_tool("agenttx_commit", {}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="127.0.0.1:50051", help="AgentTx service")
    parser.add_argument("--url", default=None, help="a running `agenttx mcp --transport http`")
    ns = parser.parse_args()
    server: StdioServerParameters | str = ns.url or StdioServerParameters(
        command=sys.executable, args=["-m", "agenttx", "mcp", "--target", ns.target])
    anyio.run(run, server)


if __name__ == "__main__":
    main()
