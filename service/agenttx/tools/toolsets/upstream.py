"""One upstream MCP server: `tools/list` and `tools/call` over streamable HTTP with the
official `mcp` SDK, a bounded connection pool, and errors sorted into what the agent and
the outbox need to know (docs/toolsets.md, "Errors").

Why one long-lived `mcp.Client` per upstream: with the stateless protocol revision
(2026-07-28) a call needs no handshake at all, and the client's connect-time probe
(`server/discover`) is paid once; an older server gets one `initialize` per session, not
per call. Creating a client per call costs several times a call's own CPU (measured:
docs/benchmarks.md). The session is owned by a background task (the SDK's task groups
must be left by the task that entered them) and is replaced when it breaks.

Why a transport of our own under the SDK's `httpx2` client (`_Transport`): the SDK maps
every HTTP failure to one JSON-RPC error, and a refused connection inside its transport
tears the whole session down (callers would see a bare `CancelledError`). Our transport
never raises: it records what really happened (connect refused, timed out, HTTP status)
in the calling task's `_CallRecord` (a context variable the SDK carries into the task
that makes the request) and answers 503, so the session survives and the error is
classified from facts, not from the SDK's prose. The same hook sets the header values
(read from files, cached by `stat`, so a rotated Secret is used on the next call).

What it must never do: put a header value anywhere but on the wire to the upstream (not
in logs, errors, hints, etcd or answers), block the event loop (files are read in a
worker thread), or let one slow upstream hold more than its pool's connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx2
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp_types import (
    CONNECTION_CLOSED,
    INVALID_REQUEST,
    REQUEST_TIMEOUT,
    CallToolResult,
    Implementation,
    RequestParamsMeta,
    TextContent,
)
from mcp_types import Tool as McpTool
from pydantic import ValidationError

from ...contracts.toolsets import Header
from ...observability.context import note

log = logging.getLogger(__name__)
# httpx2 logs every request at INFO (URL and status); one line per step is the RPC's.
logging.getLogger("httpx2").setLevel(logging.WARNING)

IDEMPOTENCY_META = "io.agenttx/idempotency-key"
CLIENT_INFO = Implementation(name="agenttx", version="0.1.0")
# A header file is stat-ed at most this often (Kubernetes swaps a Secret volume's files
# atomically; stat follows the symlink, so the next stat after a rotation sees it).
HEADER_RECHECK_S = 1.0
_MAX_PAGES = 100
# An answer is read whole only up to this (twice what any step answer may carry, engine
# limits): a larger one could not be a step's output anyway, and must not cost memory.
MAX_ANSWER_BYTES = 8 * 1024 * 1024

FDW_ERROR = "fdw_error"
FDW_UNREACHABLE = "fdw_unable_to_establish_connection"


class UpstreamError(Exception):
    """A call that did not produce a result.

    `category`: `fdw_error` (the upstream answered, and refused: `isError`, a JSON-RPC
    error, HTTP 4xx other than 408/429) or `fdw_unable_to_establish_connection` (could not
    connect, timed out, HTTP 5xx/408/429). `permanent`: retrying the same call cannot
    help (a deferred call becomes a dead letter). `maybe_applied`: the upstream may have
    acted (the request was sent and no answer came back) — a saga's intent then decides
    (docs/toolsets.md, "Crash windows"). The message is safe to show an agent."""

    def __init__(self, category: str, message: str, *, permanent: bool,
                 maybe_applied: bool) -> None:
        super().__init__(message)
        self.category = category
        self.message = message
        self.permanent = permanent
        self.maybe_applied = maybe_applied


@dataclass
class _CallRecord:
    """What the HTTP layer saw during one call (filled in by `_Transport`)."""

    headers: Mapping[str, str] = field(default_factory=dict)
    status: int | None = None
    error: str | None = None
    sent: bool = False          # a request body may have reached the upstream
    too_large: bool = False     # the answer exceeded MAX_ANSWER_BYTES


_CALL: contextvars.ContextVar[_CallRecord | None] = contextvars.ContextVar(
    "agenttx_upstream_call", default=None)

# httpx2 errors raised before the request could reach the upstream.
_NOT_SENT = (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout,
             httpx2.UnsupportedProtocol, httpx2.ProxyError)


class _Transport(httpx2.AsyncBaseTransport):
    """httpx2's pooled transport that never raises (see the module docstring)."""

    def __init__(self, owner: Upstream, limits: httpx2.Limits) -> None:
        self.owner = owner
        self.inner = httpx2.AsyncHTTPTransport(limits=limits)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        record = _CALL.get()
        for name, value in (record.headers if record is not None
                            else self.owner.last_headers).items():
            request.headers[name] = value
        try:
            response = await self.inner.handle_async_request(request)
            if record is not None:
                record.sent = True
                record.status = response.status_code
            if response.headers.get("content-type", "").startswith("text/event-stream"):
                return response  # the SDK reads SSE streams itself and survives their errors
            chunks, size = [], 0
            try:
                async for chunk in response.aiter_bytes():  # decoded
                    size += len(chunk)
                    if size > MAX_ANSWER_BYTES:
                        if record is not None:
                            record.too_large = True
                        return httpx2.Response(502, request=request, content=b"")
                    chunks.append(chunk)
            finally:
                await response.aclose()
            headers = [(k, v) for k, v in response.headers.multi_items()
                       if k.lower() not in ("content-encoding", "transfer-encoding",
                                            "content-length")]
            return httpx2.Response(response.status_code, headers=headers,
                                   content=b"".join(chunks), request=request)
        except httpx2.TransportError as exc:
            if record is not None:
                record.sent = record.sent or not isinstance(exc, _NOT_SENT)
                record.error = _describe_transport_error(exc, self.owner.timeout_s)
                record.status = None
            return httpx2.Response(503, request=request, content=b"")

    async def aclose(self) -> None:
        await self.inner.aclose()


def _describe_transport_error(exc: httpx2.TransportError, timeout_s: float) -> str:
    if isinstance(exc, httpx2.TimeoutException):
        return f"did not answer within {timeout_s:g}s"
    if isinstance(exc, httpx2.ConnectError):
        return "refused the connection" if "refused" in str(exc).lower() or \
            "connection attempts failed" in str(exc).lower() else "could not be connected to"
    return f"dropped the connection ({type(exc).__name__})"


class _HeaderFile:
    """A header value kept in a file (a projected Secret): re-read when its stat
    signature changes, checked at most once per HEADER_RECHECK_S."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._signature: tuple[int, ...] | None = None
        self._value = ""
        self._checked = 0.0

    async def value(self) -> str:
        now = time.monotonic()
        if self._signature is not None and now - self._checked < HEADER_RECHECK_S:
            return self._value
        signature, value = await asyncio.to_thread(self._read, self._signature)
        self._checked = now
        if signature != self._signature:
            self._signature, self._value = signature, value if value is not None else ""
        return self._value

    def _read(self, known: tuple[int, ...] | None) -> tuple[tuple[int, ...], str | None]:
        st = os.stat(self.path)
        signature = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if signature == known:
            return signature, None
        with open(self.path, encoding="utf-8") as f:
            return signature, f.read().rstrip("\r\n")


def where(url: str) -> str:
    """The upstream as messages name it: scheme://host:port (never a query string)."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}"


class Upstream:
    """An upstream MCP server as one toolset declares it (URL, headers, timeout)."""

    def __init__(self, url: str, headers: Sequence[Header], timeout_s: float, *,
                 max_connections: int = 16, label: str = "") -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.label = label or where(url)
        self._literal = {h.name: h.value for h in headers if h.value is not None}
        self._files = {h.name: _HeaderFile(h.file) for h in headers if h.file is not None}
        self.last_headers: Mapping[str, str] = dict(self._literal)
        limits = httpx2.Limits(max_connections=max_connections,
                               max_keepalive_connections=max_connections)
        self._http = httpx2.AsyncClient(
            transport=_Transport(self, limits),
            timeout=httpx2.Timeout(timeout_s, read=timeout_s + 5.0))
        self._client: Client | None = None
        self._session_record: _CallRecord | None = None
        self._owner: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    # ---- headers -------------------------------------------------------------------------

    async def _headers(self) -> dict[str, str]:
        out = dict(self._literal)
        for name, source in self._files.items():
            try:
                out[name] = await source.value()
            except OSError as exc:
                raise UpstreamError(
                    FDW_UNREACHABLE, f"{self.label}: cannot read the {name} header from its "
                    f"file ({exc.strerror or type(exc).__name__}); nothing was sent",
                    permanent=False, maybe_applied=False) from None
        self.last_headers = out
        if self._session_record is not None:
            self._session_record.headers = out
        return out

    # ---- the session ---------------------------------------------------------------------

    async def _session(self, record: _CallRecord) -> Client:
        async with self._lock:
            if self._closed:
                raise UpstreamError(FDW_UNREACHABLE, f"{self.label}: toolset was removed",
                                    permanent=False, maybe_applied=False)
            if self._client is not None and self._owner is not None \
                    and not self._owner.done():
                return self._client
            # The session's own requests (the connect-time probe, a legacy session's GET
            # stream, its closing DELETE) record into a record of their own.
            session_record = _CallRecord(headers=record.headers)
            context = contextvars.copy_context()
            context.run(_CALL.set, session_record)
            ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
            stop = asyncio.Event()
            self._stop, self._session_record = stop, session_record
            self._owner = asyncio.create_task(self._own(ready, stop),
                                              name=f"mcp-upstream {self.label}",
                                              context=context)
            try:
                self._client = await ready
            except BaseException:
                record.status, record.error = session_record.status, session_record.error
                raise
            return self._client

    async def _own(self, ready: asyncio.Future[Client], stop: asyncio.Event) -> None:
        """Hold one SDK session open until `stop` (or until it breaks)."""
        try:
            async with Client(streamable_http_client(self.url, http_client=self._http,
                                                     max_sse_event_size=MAX_ANSWER_BYTES),
                              mode="auto", client_info=CLIENT_INFO,
                              read_timeout_seconds=self.timeout_s, cache=None) as client:
                ready.set_result(client)
                log.info("connected to upstream MCP server",
                         extra={"upstream": self.label, "protocol": client.protocol_version})
                await stop.wait()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller that waits
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception)
                                    else ConnectionError("session task ended"))
            elif not isinstance(exc, asyncio.CancelledError):
                log.warning("upstream MCP session ended", extra={
                    "upstream": self.label, "error": f"{type(exc).__name__}: {exc}"[:300]})

    async def _reset(self, client: Client) -> None:
        """Drop a broken session (the next call opens a new one)."""
        async with self._lock:
            if self._client is client and self._stop is not None:
                self._stop.set()
                self._client = None

    async def close(self) -> None:
        async with self._lock:
            self._closed = True
            if self._stop is not None:
                self._stop.set()
            owner, self._owner, self._client = self._owner, None, None
        if owner is not None:
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(owner, 5.0)
        await self._http.aclose()

    # ---- calls ---------------------------------------------------------------------------

    async def list_tools(self) -> list[McpTool]:
        """Every tool the upstream lists (all pages)."""
        async def fetch(client: Client) -> list[McpTool]:
            tools: list[McpTool] = []
            cursor: str | None = None
            for _ in range(_MAX_PAGES):
                page = await client.list_tools(cursor=cursor, cache_mode="refresh")
                tools.extend(page.tools)
                cursor = page.next_cursor
                if cursor is None:
                    break
            return tools
        return await self._run(fetch, "tools/list")

    async def call(self, tool: str, arguments: Mapping[str, Any],
                   idempotency_key: str) -> Any:
        """`tools/call`: the output (`structuredContent`, else `{"text": ...}`), or
        UpstreamError."""
        async def send(client: Client) -> CallToolResult:
            return await client.call_tool(tool, dict(arguments),
                                          read_timeout_seconds=self.timeout_s,
                                          meta=_meta(idempotency_key))
        result = await self._run(send, "tools/call")
        if result.is_error:
            text = _text(result) or "the tool reported an error without a message"
            raise UpstreamError(FDW_ERROR, text, permanent=True, maybe_applied=False)
        if result.structured_content is not None:
            return result.structured_content
        return {"text": _text(result)}

    async def _run(self, op: Any, what: str) -> Any:
        started = time.perf_counter()
        record = _CallRecord(headers=await self._headers())
        token = _CALL.set(record)
        client: Client | None = None
        try:
            async with asyncio.timeout(self.timeout_s * 2 + 5):
                for attempt in range(2):
                    client = await self._session(record)
                    try:
                        return await op(client)
                    except MCPError as exc:
                        if attempt == 0 and _session_gone(exc) and not _answered(record):
                            await self._reset(client)  # e.g. the upstream restarted
                            record.status = record.error = None
                            continue
                        raise
        except UpstreamError:
            raise
        except MCPError as exc:
            if client is not None and exc.code == CONNECTION_CLOSED:
                await self._reset(client)
            raise self._classify(exc, record, what) from None
        except TimeoutError:
            if client is not None:
                await self._reset(client)
            raise UpstreamError(FDW_UNREACHABLE, f"{self.label} did not answer within "
                                f"{self.timeout_s:g}s", permanent=False,
                                maybe_applied=record.sent) from None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # we are being cancelled
            # the SDK tore its session down under us: a broken connection
            if client is not None:
                await self._reset(client)
            raise UpstreamError(FDW_UNREACHABLE, f"{self.label} dropped the connection",
                                permanent=False, maybe_applied=record.sent) from None
        except (ValidationError, RuntimeError) as exc:
            # an answer that is not a valid result (or whose structured content does not
            # match the tool's own output schema): the upstream did answer
            raise UpstreamError(FDW_ERROR, f"{self.label} answered {what} with an invalid "
                                f"result: {str(exc).splitlines()[0][:150]}", permanent=True,
                                maybe_applied=record.sent) from None
        except OSError as exc:
            if client is not None:
                await self._reset(client)
            raise UpstreamError(FDW_UNREACHABLE, f"{self.label} could not be reached "
                                f"({type(exc).__name__})", permanent=False,
                                maybe_applied=record.sent) from None
        finally:
            _CALL.reset(token)
            # the RPC's one log line says how long the upstream took (docs/toolsets.md)
            note(upstream=self.label, upstream_ms=round((time.perf_counter() - started)
                                                        * 1000, 2))
        raise AssertionError("unreachable")

    def _classify(self, exc: MCPError, record: _CallRecord, what: str) -> UpstreamError:
        if record.too_large:
            return UpstreamError(FDW_ERROR, f"{self.label} answered {what} with more than "
                                 f"{MAX_ANSWER_BYTES // (1024 * 1024)} MiB", permanent=True,
                                 maybe_applied=True)
        if exc.code == REQUEST_TIMEOUT:
            return UpstreamError(FDW_UNREACHABLE, f"{self.label} did not answer {what} within "
                                 f"{self.timeout_s:g}s", permanent=False, maybe_applied=True)
        if record.error is not None:
            return UpstreamError(FDW_UNREACHABLE, f"{self.label} {record.error}",
                                 permanent=False, maybe_applied=record.sent)
        status = record.status
        if status is not None and status >= 400 and _is_http_stand_in(exc):
            if status >= 500 or status in (408, 429):
                # a gateway timeout may hide an upstream that is still working
                return UpstreamError(FDW_UNREACHABLE, f"{self.label} answered HTTP {status}",
                                     permanent=False, maybe_applied=status == 504)
            return UpstreamError(FDW_ERROR, f"{self.label} refused {what}: HTTP {status}",
                                 permanent=True, maybe_applied=False)
        if exc.code == CONNECTION_CLOSED:
            return UpstreamError(FDW_UNREACHABLE, f"{self.label} closed the connection",
                                 permanent=False, maybe_applied=True)
        message = " ".join(str(exc.error.message or "").split()) or f"error {exc.code}"
        return UpstreamError(FDW_ERROR, message, permanent=True, maybe_applied=False)


def _meta(idempotency_key: str) -> RequestParamsMeta:
    meta: Any = {IDEMPOTENCY_META: idempotency_key}  # an open map (extra_items=Any)
    return meta  # type: ignore[no-any-return]


def _text(result: CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))


def _session_gone(exc: MCPError) -> bool:
    """A legacy session the upstream no longer knows (it restarted): HTTP 404."""
    return exc.code == INVALID_REQUEST and "session terminated" in str(exc).lower()


def _answered(record: _CallRecord) -> bool:
    return record.status is not None and record.status != 404


def _is_http_stand_in(exc: MCPError) -> bool:
    """The SDK's own stand-in error for a non-2xx answer without a JSON-RPC body (as
    opposed to a JSON-RPC error the upstream sent)."""
    message = str(exc.error.message or "")
    return message in ("Server returned an error response", "Not Found", "Session terminated")


__all__ = ["FDW_ERROR", "FDW_UNREACHABLE", "IDEMPOTENCY_META", "Upstream", "UpstreamError",
           "where"]
