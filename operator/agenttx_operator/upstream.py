"""Asking a toolset's upstream MCP server which tools it has: MCP `tools/list` over
streamable HTTP, with the official SDK's client, the toolset's headers and its timeout.

Why the operator asks at all: a toolset that names a tool the server does not have
would fail every step that uses it, far from where the mistake was made; asking before
publishing turns it into a status a person reads in `kubectl get attool`.

What it must never do: log, raise or return a header's value (errors carry the URL and
what went wrong, never the request), or hang a handler (the whole exchange is bounded).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from agenttx.contracts.toolsets import Upstream

# A server that pages forever must not keep a handler busy (the SDK's own relist cap).
MAX_PAGES = 100
# tools/list takes up to three requests (discovery or initialize, the list, a session
# close); each may take the toolset's timeout, the whole listing at most LISTING_MAX_S:
# a toolset's timeout is for its slowest tool call (up to 300 s), while a listing that
# takes a minute is broken, and a reconcile holds its toolset's lock meanwhile.
REQUESTS_PER_LISTING = 3
LISTING_MAX_S = 60.0


class UpstreamUnreachable(Exception):
    """The upstream did not answer tools/list (connection, timeout, HTTP error, a reply
    that is not MCP). The message says which, in one line, without any header."""


async def list_tools(upstream: Upstream, headers: Mapping[str, str]) -> set[str]:
    """The names of every tool the upstream offers (all pages)."""
    timeout = min(upstream.timeout_s, LISTING_MAX_S)
    total = min(timeout * REQUESTS_PER_LISTING, LISTING_MAX_S)
    refused: list[httpx2.Response] = []

    async def record(response: httpx2.Response) -> None:
        # The SDK turns an HTTP error into a generic JSON-RPC error; keep the status.
        if response.status_code >= 400:
            refused.append(response)

    try:
        async with asyncio.timeout(total), httpx2.AsyncClient(
                headers=dict(headers), timeout=timeout, follow_redirects=False,
                event_hooks={"response": [record]}) as http:
            transport = streamable_http_client(upstream.url, http_client=http)
            async with Client(transport, read_timeout_seconds=timeout, cache=None) as client:
                names: set[str] = set()
                cursor: str | None = None
                for _ in range(MAX_PAGES):
                    page = await client.list_tools(cursor=cursor)
                    names.update(tool.name for tool in page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        return names
                raise UpstreamUnreachable(
                    f"{upstream.url} lists more than {MAX_PAGES} pages of tools")
    except UpstreamUnreachable:
        raise
    except TimeoutError:
        raise UpstreamUnreachable(
            f"{upstream.url} did not answer tools/list within {total:g}s (timeoutSeconds "
            f"{upstream.timeout_s:g})") from None
    except Exception as exc:  # any failure of the exchange: reported, retried by the caller
        if refused:
            last = refused[-1]
            raise UpstreamUnreachable(
                f"{upstream.url} answered HTTP {last.status_code} {last.reason_phrase}".strip()
            ) from None
        raise UpstreamUnreachable(f"{upstream.url}: {describe(exc)}") from None


def describe(exc: BaseException) -> str:
    """One line for a failed exchange: the innermost meaningful error (the SDK runs the
    transport in task groups, so errors arrive wrapped in exception groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, httpx2.HTTPStatusError):
        return f"HTTP {exc.response.status_code} {exc.response.reason_phrase}".strip()
    if isinstance(exc, httpx2.ConnectError):
        return f"cannot connect ({_first_line(exc) or type(exc).__name__})"
    if isinstance(exc, httpx2.TimeoutException):
        return f"timed out ({type(exc).__name__})"
    text = _first_line(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:300] if lines else ""
