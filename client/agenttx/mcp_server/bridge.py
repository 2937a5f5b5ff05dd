"""The MCP server: tool calls in, AgentTx steps out, answers written for a model.

Why a bridge and not a proxy: the model should never handle step ids or protocol
details. Per MCP session (stdio: the one connection; streamable HTTP: `Mcp-Session-Id`)
the server keeps the open transaction and its step id, begins one on the first tool call,
and turns each step's outcome into text the model can act on (the hint, the category, the
rollback strategy, what was undone and which step comes next, in the names the model
calls) and into `structuredContent` (catalog.STEP_OUTPUT_SCHEMA).

A session that closes takes its transaction with it: when the connection ends (HTTP
`DELETE` of the session, the session idling out after its client went away, stdio's
end), the open transaction is rolled back at once (a per-connection teardown callback),
never left to the service's idle reaper while it holds locks.

Under a stateless protocol revision (2026-07-28) there is no session: `agenttx_begin`
returns a transaction handle and every other tool needs it as `transaction` (a call
without one is an error result naming agenttx_begin; nothing is begun implicitly); each
call re-reads the step id from the service (one GetTransaction) before stepping.

With `--require-auth` (HTTP), each request's bearer token is the caller's own credential:
the service sees that principal, through a client per token.

What it must never do: retry a step or a commit (the client refuses to, and reports a
lost answer as such), invent a step id, keep a transaction it cannot name, or act on one
transaction with another caller's credential. It talks to the service only through
`agenttx.client.AsyncClient`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp.types.version import MODERN_PROTOCOL_VERSIONS

from ..client import (
    AgentTxError,
    AsyncClient,
    AsyncTransaction,
    Conflict,
    NotFound,
    OutcomeUnknown,
    StepResult,
    Strategy,
    TransactionState,
)
from ..client._version import __version__
from . import catalog
from .catalog import BEGIN, COMMIT, ROLLBACK, STATUS, Catalog

log = logging.getLogger(__name__)

INSTRUCTIONS = (
    "AgentTx runs your tool calls as the steps of one transaction: nothing is committed "
    "until you call agenttx_commit, and agenttx_rollback undoes it all. With an MCP session "
    "the first tool call begins a transaction (or call agenttx_begin), and closing the "
    "session rolls back whatever was not committed. When a step fails, the result says why "
    "(a hint naming the exact table, key, file or field), what AgentTx undid, and which "
    "step comes next: follow the hint and retry, changed. Constraints learned from failures "
    "stay valid for the whole transaction. Later steps may use an earlier step's output as "
    "\"${steps.N.field}\". If your client keeps no MCP session, call agenttx_begin first and "
    "pass the handle it returns as `transaction` in every call.")

INVALID_PARAMS, INTERNAL_ERROR = -32602, -32603  # JSON-RPC 2.0
CLOSE_TIMEOUT_S = 15.0
# How long a tools/list answer from the service is reused.
CATALOG_MAX_AGE_S = 5.0
NO_HANDLE = ("This call needs a transaction, and your client keeps no MCP session: call "
             "agenttx_begin first and pass its transaction handle as `transaction`.")
CLOSED_REASON = "agenttx mcp: the MCP session closed with the transaction open"


@dataclass
class Session:
    """What the server keeps for one MCP session."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    tx: AsyncTransaction | None = None
    users: int = 0  # calls holding or waiting for the lock; the entry is dropped at 0
    token: str | None = None  # the credential that opened it (with --require-auth)


@dataclass(frozen=True)
class Settings:
    target: str
    token: str | None = None
    tls: Any = None
    agent_id: str = "agenttx-mcp"
    metadata: Mapping[str, str] = field(default_factory=dict)
    # HTTP: every request carries its caller's bearer token, forwarded to the service
    require_auth: bool = False


def _text(text: str, *, error: bool = False,
          structured: dict[str, Any] | None = None) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                structured_content=structured, is_error=error)


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    scheme, _, token = (headers.get("authorization") or "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class Bridge:
    """Holds the clients and the per-session transactions; builds the lowlevel Server."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # the most recently listed catalog (what input-schema lookups without a caller
        # use); per credential, the catalog its ListTools returned and when
        self.catalog = Catalog(())
        self._catalogs: dict[str | None, tuple[Catalog, float]] = {}
        self.sessions: dict[str, Session] = {}
        self._clients: dict[str | None, AsyncClient] = {}

    # ---- plumbing ----------------------------------------------------------------------
    def client_for(self, token: str | None) -> AsyncClient:
        """The client calling the service with `token` (None: the configured one)."""
        if token not in self._clients:
            self._clients[token] = AsyncClient(
                self.settings.target, token=token if token is not None else self.settings.token,
                tls=self.settings.tls)
        return self._clients[token]

    @property
    def client(self) -> AsyncClient:
        return self.client_for(None)

    def token_of(self, ctx: ServerRequestContext[Any, Any]) -> str | None:
        """Whose credentials a request carries: with --require-auth, the HTTP request's
        bearer token (the middleware refused requests without one); else the configured
        one (None)."""
        if not self.settings.require_auth or ctx.request is None:
            return None
        return bearer_token(ctx.request.headers)

    async def refresh_catalog(self, token: str | None = None, *,
                              max_age_s: float = CATALOG_MAX_AGE_S) -> Catalog:
        """The tool list as the service has it now for this caller (ListTools), re-read
        when older than `max_age_s`, so a toolset published meanwhile shows up."""
        found, at = self._catalogs.get(token, (None, 0.0))
        now = time.monotonic()
        if found is None or now - at > max_age_s:
            found = Catalog(await self.client_for(token).tools())
            self._catalogs[token] = (found, now)
            self.catalog = found
        return found

    def _catalog(self, token: str | None) -> Catalog:
        found, _ = self._catalogs.get(token, (None, 0.0))
        return found if found is not None else self.catalog

    def _input_schema(self, name: str) -> dict[str, Any] | None:
        return self.catalog.input_schema(name)

    @asynccontextmanager
    async def lifespan(self, _server: Server[Any]) -> AsyncIterator[dict[str, Any]]:
        try:
            yield {}
        finally:
            # Shielded: on SIGTERM the serving scope is already cancelled, and the open
            # transactions must still be aborted (bounded, so shutdown cannot hang).
            with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
                await self.close()

    async def close(self) -> None:
        """Abort what sessions left open (uncommitted work is never committed implicitly),
        then close the channels."""
        for key, session in list(self.sessions.items()):
            tx = session.tx
            if tx is not None and not tx.finished:
                try:
                    await tx.rollback(reason="agenttx mcp stopped with the transaction open")
                    log.info("aborted an open transaction at shutdown",
                             extra={"tx": tx.id, "session": key})
                except AgentTxError as exc:
                    log.warning("could not abort an open transaction at shutdown",
                                extra={"tx": tx.id, "error": str(exc)})
        self.sessions.clear()
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()

    def server(self) -> Server[Any]:
        return Server(
            "agenttx", version=__version__, title="AgentTx",
            description="Transactions over an agent's tool calls", instructions=INSTRUCTIONS,
            lifespan=self.lifespan, get_tool_input_schema=self._input_schema,
            on_list_tools=self.list_tools, on_call_tool=self.call_tool)

    @staticmethod
    def session_key(ctx: ServerRequestContext[Any, Any]) -> str | None:
        """The MCP session this request belongs to, or None under a stateless revision."""
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return None
        request = ctx.request
        if request is None:
            return "stdio"  # one process, one connection
        sid = request.headers.get("mcp-session-id")
        return f"http:{sid}" if sid else None

    def _watch_close(self, ctx: ServerRequestContext[Any, Any], key: str) -> None:
        """Roll back the session's transaction the moment its connection ends.

        The SDK unwinds each connection's `exit_stack` when it closes (an HTTP session
        deleted or idled out, stdio's end); that is where per-connection cleanup belongs
        (mcp.server.connection). The connection is reached through the request's
        session: the SDK offers no public accessor yet."""
        connection = getattr(ctx.session, "_connection", None)
        if connection is None:  # pragma: no cover - an SDK without it: shutdown aborts
            log.warning("cannot watch the MCP connection; its transaction is rolled back "
                        "only at shutdown or by the service's idle reaper")
            return
        if connection.state.get("agenttx.watched"):
            return
        connection.state["agenttx.watched"] = True
        connection.exit_stack.push_async_callback(self._session_closed, key)

    async def _session_closed(self, key: str) -> None:
        session = self.sessions.pop(key, None)
        tx = session.tx if session is not None else None
        if tx is None or tx.finished:
            return
        try:
            result = await tx.rollback(reason=CLOSED_REASON)
        except AgentTxError as exc:
            log.warning("could not roll back the transaction of a closed MCP session",
                        extra={"tx": tx.id, "session": key, "error": str(exc)})
            return
        log.info("rolled back the transaction of a closed MCP session",
                 extra={"tx": tx.id, "session": key, "rolled_back": result.rolled_back,
                        "compensation_errors": list(result.compensation_errors)})

    def _metadata(self, ctx: ServerRequestContext[Any, Any]) -> dict[str, str]:
        meta = dict(self.settings.metadata)
        params = ctx.session.client_params
        if params is not None and params.client_info is not None:
            meta.setdefault("mcp_client", params.client_info.name[:256])
        return meta

    async def _begin(self, ctx: ServerRequestContext[Any, Any],
                     token: str | None) -> AsyncTransaction:
        tx = await self.client_for(token).begin(agent_id=self.settings.agent_id,
                                                metadata=self._metadata(ctx))
        log.info("transaction begun for MCP", extra={"tx": tx.id,
                                                     "session": self.session_key(ctx)})
        return tx

    # ---- MCP handlers ------------------------------------------------------------------
    async def list_tools(self, ctx: ServerRequestContext[Any, Any],
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        token = self.token_of(ctx)
        try:
            found = await self.refresh_catalog(token)
        except AgentTxError as exc:
            raise MCPError(code=INTERNAL_ERROR, message=self._refused(exc, token)) from None
        return types.ListToolsResult(tools=found.tools())

    async def call_tool(self, ctx: ServerRequestContext[Any, Any],
                        params: types.CallToolRequestParams) -> types.CallToolResult:
        name = params.name
        args = dict(params.arguments or {})
        token = self.token_of(ctx)
        cat = self._catalog(token)
        entry = cat.entries.get(name)
        if entry is None and name not in cat.control:
            try:  # a tool published since the last tools/list (or none listed yet)
                cat = await self.refresh_catalog(token, max_age_s=0)
                entry = cat.entries.get(name)
            except AgentTxError as exc:
                return _text(self._refused(exc, token), error=True)
        if entry is None and name not in cat.control:
            raise MCPError(code=INVALID_PARAMS, message=f"Unknown tool: {name}")
        handle = args.pop(entry.handle if entry else catalog.HANDLE, None)
        if handle is not None and not isinstance(handle, str):
            return _text(f"`transaction` must be the handle string agenttx_begin returned, "
                         f"not {json.dumps(handle)}.", error=True)
        key = self.session_key(ctx)
        if key is None:
            return await self._guarded(ctx, None, cat, token, handle, entry, name, args)
        session = self.sessions.setdefault(key, Session(token=token))
        if session.token != token:  # the SDK binds sessions to credentials; so do we
            return _text("This MCP session was opened with another credential.", error=True)
        self._watch_close(ctx, key)
        session.users += 1
        try:
            async with session.lock:  # one call at a time per session: step ids never race
                return await self._guarded(ctx, session, cat, token, handle, entry, name, args)
        finally:
            session.users -= 1
            if session.users == 0 and session.tx is None and self.sessions.get(key) is session:
                self.sessions.pop(key, None)

    async def _guarded(self, ctx: ServerRequestContext[Any, Any], session: Session | None,
                       cat: Catalog, token: str | None, handle: str | None,
                       entry: catalog.Entry | None, name: str,
                       args: dict[str, Any]) -> types.CallToolResult:
        try:
            if entry is not None:
                return await self._step(ctx, session, cat, token, handle, entry.agenttx_name,
                                        name, args)
            return await self._control(ctx, session, cat, token, handle, name, args)
        except OutcomeUnknown as exc:
            if session is not None and exc.ended:
                session.tx = None
            return _text(f"{cat.text(exc.details)}. Call agenttx_status to see where the "
                         "transaction stands before doing anything else.", error=True)
        except NotFound as exc:
            if session is not None and session.tx is not None and \
                    (handle is None or handle == session.tx.id):
                session.tx = None
            again = ("The next tool call begins a new transaction." if session is not None
                     else "Call agenttx_begin for a new one.")
            return _text(f"The transaction no longer exists ({cat.text(exc.details)}): it was "
                         f"committed, aborted, or expired after being idle. {again}",
                         error=True)
        except AgentTxError as exc:
            return _text(self._refused(exc, token, cat), error=True)

    def _refused(self, exc: AgentTxError, token: str | None = None,
                 cat: Catalog | None = None) -> str:
        """An RPC error in words the model can act on."""
        details = (cat or self.catalog).text(exc.details)
        if exc.code.name in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
            return (f"The AgentTx service at {self.client_for(token).target} is unreachable "
                    f"({details}); try again later.")
        return f"AgentTx refused the call: {exc.code.name}: {details}"

    # ---- transactions ------------------------------------------------------------------
    async def _resolve(self, ctx: ServerRequestContext[Any, Any], session: Session | None,
                       token: str | None, handle: str | None, *,
                       begin: bool) -> tuple[AsyncTransaction | None, bool]:
        """The transaction a call acts on, and whether this call began it. Only a session
        may begin one implicitly; without a session and without a handle there is none."""
        if handle:
            if session is not None and session.tx is not None and session.tx.id == handle:
                return session.tx, False
            return await self.client_for(token).attach(handle), False
        if session is None:
            return None, False
        if session.tx is not None and not session.tx.finished:
            return session.tx, False
        if not begin:
            return None, False
        session.tx = await self._begin(ctx, token)
        return session.tx, True

    async def _step(self, ctx: ServerRequestContext[Any, Any], session: Session | None,
                    cat: Catalog, token: str | None, handle: str | None, tool: str,
                    exposed: str, args: dict[str, Any]) -> types.CallToolResult:
        tx, began = await self._resolve(ctx, session, token, handle, begin=True)
        if tx is None:
            return _text(NO_HANDLE, error=True)
        r = await tx.step(tool, args)
        if session is not None and session.tx is tx and r.ended:
            session.tx = None
        prefix = f"Began transaction {tx.id}. " if began else ""
        return _text(prefix + step_text(r, exposed, tx.id, cat, session is not None),
                     error=not r.ok, structured=step_structured(r, tx.id, cat))

    async def _control(self, ctx: ServerRequestContext[Any, Any], session: Session | None,
                       cat: Catalog, token: str | None, handle: str | None, name: str,
                       args: dict[str, Any]) -> types.CallToolResult:
        if name == BEGIN:
            if args:
                return _text(f"agenttx_begin takes no arguments (got {', '.join(args)}).",
                             error=True)
            if session is not None and session.tx is not None and not session.tx.finished:
                tx = session.tx
                return _text(f"Transaction {tx.id} is already open (next step "
                             f"{tx.next_step_id}); commit it or roll it back first.",
                             error=True, structured={"transaction": tx.id})
            began = await self._begin(ctx, token)
            if session is not None:
                session.tx = began
            text = f"Began transaction {began.id}; the next step is 1."
            if session is None:
                text += (f" Your client keeps no session: pass \"transaction\": \"{began.id}\" "
                         "to every AgentTx tool call.")
            return _text(text, structured={"transaction": began.id, "next_step_id": 1})

        to_step = args.pop("to_step", None) if name == ROLLBACK else None
        if args:
            return _text(f"{name} got unknown arguments: {', '.join(args)}.", error=True)
        if to_step is not None and (not isinstance(to_step, int) or isinstance(to_step, bool)
                                    or to_step < 1):
            return _text(f"to_step must be a step number >= 1, not {json.dumps(to_step)}.",
                         error=True)
        found, _ = await self._resolve(ctx, session, token, handle, begin=False)
        if found is None:
            if session is None:
                return _text(NO_HANDLE, error=True)
            if name == STATUS:
                return _text("No transaction is open; the next tool call begins one.")
            verb = "commit" if name == COMMIT else "roll back"
            return _text(f"No transaction is open, so there is nothing to {verb}.", error=True)
        tx = found
        if name == STATUS:
            state = await tx.get()
            return _text(status_text(state, cat), structured={"transaction": tx.id,
                                                              **_state_dict(state, cat)})
        if name == COMMIT:
            return await self._commit(session, tx, cat)
        return await self._rollback(session, tx, to_step)

    async def _commit(self, session: Session | None, tx: AsyncTransaction,
                      cat: Catalog) -> types.CallToolResult:
        again = "begin again" if session is not None else "call agenttx_begin"
        try:
            done = await tx.commit()
        except Conflict as exc:
            if session is not None:
                session.tx = None
            return _text(f"Commit failed: {cat.text(exc.details)}. Every step was undone and "
                         f"the transaction ended: {again} and redo the work, reading the data "
                         "afresh.", error=True, structured={"transaction": tx.id,
                                                            "committed": False})
        if session is not None and session.tx is tx:
            session.tx = None
        if done.awaiting_approval:
            return _text(f"Transaction {tx.id} was not committed yet: it awaits a person's "
                         f"approval (digest {done.approval_digest}).",
                         structured={"transaction": tx.id, "committed": False,
                                     "awaiting_approval": True,
                                     "approval_digest": done.approval_digest})
        text = (f"Committed transaction {tx.id}: {_n(done.steps_committed, 'step')}, "
                f"{_n(done.effects_dispatched, 'effect')} delivered.")
        if done.dispatch_errors:
            text += (" Some effects were not delivered yet and will be retried in the "
                     f"background: {'; '.join(done.dispatch_errors)}.")
        return _text(text, structured={"transaction": tx.id, "committed": done.committed,
                                       "steps_committed": done.steps_committed,
                                       "effects_dispatched": done.effects_dispatched,
                                       "dispatch_errors": list(done.dispatch_errors)})

    async def _rollback(self, session: Session | None, tx: AsyncTransaction,
                        to_step: int | None) -> types.CallToolResult:
        result = await tx.rollback(to_step, reason="agenttx_rollback (MCP)")
        if not result.rolled_back:
            return _text(
                f"Rollback of transaction {tx.id} is incomplete: "
                f"{'; '.join(result.compensation_errors)}. The transaction waits for a manual "
                "rollback: fix what blocks the undo (or ask a person to), then call "
                "agenttx_rollback again; it resumes where it stopped.",
                error=True, structured={"transaction": tx.id, "rolled_back": False,
                                        "compensation_errors": list(result.compensation_errors)})
        structured = {"transaction": tx.id, "rolled_back": True,
                      "next_step_id": result.next_step_id,
                      "compensations_run": result.compensations_run}
        if to_step:
            return _text(f"Undid the steps from {to_step} on "
                         f"({_n(result.compensations_run, 'undo action')}); transaction "
                         f"{tx.id} continues at step {result.next_step_id}.",
                         structured=structured)
        if session is not None and session.tx is tx:
            session.tx = None
        then = ("The next tool call begins a new transaction." if session is not None
                else "Call agenttx_begin for a new one.")
        return _text(f"Aborted transaction {tx.id}: everything was undone "
                     f"({_n(result.compensations_run, 'undo action')}). {then}",
                     structured=structured)


# ---- what the model reads ----------------------------------------------------------------

def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _recovery(r: StepResult, cat: Catalog, session: bool) -> str:
    n, nxt = r.step_id, r.next_step_id
    if r.strategy is Strategy.LOCAL_BACKTRACK:
        return f"Nothing was undone. Retry step {nxt}, changed as the hint says."
    if r.strategy is Strategy.DEPENDENCY_JUMP:
        undone = f"step {r.rollback_to_step}" if r.rollback_to_step == n - 1 else \
            f"steps {r.rollback_to_step} to {n - 1}"
        return (f"AgentTx traced the failure back to step {r.rollback_to_step} and undid "
                f"{undone}. Continue from step {nxt}: redo it, changed as the hint says.")
    if r.strategy is Strategy.GLOBAL_RESET:
        return ("Every step was undone and the context was reset: start over from step 1, "
                "respecting the constraints below.")
    if r.strategy is Strategy.ABORT:
        then = ("The next tool call begins a new transaction." if session
                else "Call agenttx_begin for a new one.")
        return (f"The transaction was aborted ({cat.text(r.abort_reason) or 'no reason given'})"
                f" and everything was undone. {then}")
    if r.strategy is Strategy.MANUAL:
        errors = cat.text("; ".join(r.compensation_errors))
        return (f"Undoing failed ({errors}). The transaction waits for a manual rollback: call "
                "agenttx_rollback (it resumes where the undo stopped); other steps and commit "
                "are refused until it succeeds.")
    return f"The next step is {nxt}."


def step_text(r: StepResult, tool: str, tx_id: str, cat: Catalog | None = None,
              session: bool = True) -> str:
    cat = cat or Catalog(())
    if r.ok:
        return (f"Step {r.step_id} ({tool}) succeeded. Output: {r.output_json}\n"
                f"Next step: {r.next_step_id}; later steps can use this output as "
                f"\"${{steps.{r.step_id}.<field>}}\". Transaction {tx_id}.")
    hint = cat.text(r.hint)
    lines = [f"Step {r.step_id} ({tool}) failed: {r.category}.",
             f"Hint: {hint}",
             f"Recovery ({r.strategy.value}): {_recovery(r, cat, session)}"]
    if r.constraints and r.constraints != (r.hint,) and not r.ended:
        lines.append("Constraints learned so far (keep respecting them):")
        lines += [f"- {cat.text(c)}" for c in r.constraints]
    lines.append(f"Transaction {tx_id}.")
    return "\n".join(lines)


def step_structured(r: StepResult, tx_id: str, cat: Catalog | None = None) -> dict[str, Any]:
    """The step result as `structuredContent` (catalog.STEP_OUTPUT_SCHEMA)."""
    cat = cat or Catalog(())
    return {"ok": r.ok, "output": r.output, "category": r.category, "hint": cat.text(r.hint),
            "strategy": r.strategy.value, "next_step": r.next_step_id,
            "rollback_to_step": r.rollback_to_step, "transaction": tx_id,
            "step_id": r.step_id, "constraints": [cat.text(c) for c in r.constraints],
            "context_reset": r.context_reset, "abort_reason": cat.text(r.abort_reason),
            "compensation_errors": [cat.text(e) for e in r.compensation_errors]}


def _state_dict(v: TransactionState, cat: Catalog) -> dict[str, Any]:
    return {"status": v.status.value, "next_step_id": v.next_step_id,
            "global_resets": v.global_resets, "constraints": [cat.text(c) for c in v.constraints],
            "context": [{"step_id": c.step_id, "tool_name": catalog.mcp_name(c.tool_name),
                         "raw_context": c.raw_context} for c in v.context]}


def status_text(v: TransactionState, cat: Catalog | None = None) -> str:
    cat = cat or Catalog(())
    lines = [f"Transaction {v.transaction_id}: {v.status.value}, next step {v.next_step_id}, "
             f"{v.global_resets} global resets."]
    if v.constraints:
        lines.append("Constraints learned so far:")
        lines += [f"- {cat.text(c)}" for c in v.constraints]
    if v.context:
        lines.append("Context log:")
        lines += [f"- step {c.step_id} ({catalog.mcp_name(c.tool_name)}): {c.raw_context}"
                  for c in v.context]
    return "\n".join(lines)
