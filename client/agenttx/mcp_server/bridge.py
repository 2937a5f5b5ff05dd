"""The MCP server: tool calls in, AgentTx steps out, answers written for a model.

Why a bridge and not a proxy: the model should never handle step ids or protocol
details. Per MCP session (stdio: the one connection; streamable HTTP: `Mcp-Session-Id`)
the server keeps the open transaction and its step id, begins one on the first tool call,
and turns each step's outcome into text the model can act on: the hint, the category,
the rollback strategy, what was undone and which step comes next.

Under a stateless protocol revision (2026-07-28, or HTTP without a session) there is
nowhere to keep that, so `agenttx_begin` (or the first tool call) returns a transaction
handle and the model passes it back as `transaction`; each call then re-reads the step
id from the service (one GetTransaction) before stepping.

What it must never do: retry a step or a commit (the client refuses to, and reports a
lost answer as such), invent a step id, or keep a transaction it cannot name. It talks to
the service only through `agenttx.client.AsyncClient`.
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
    "until you call agenttx_commit, and agenttx_rollback undoes it all. The first tool call "
    "begins a transaction (or call agenttx_begin). When a step fails, the result says why "
    "(a hint naming the exact table, key, file or field), what AgentTx undid, and which "
    "step comes next: follow the hint and retry, changed. Constraints learned from failures "
    "stay valid for the whole transaction. Later steps may use an earlier step's output as "
    "\"${steps.N.field}\". If your client keeps no MCP session, pass the handle returned "
    "by agenttx_begin as `transaction` in every call.")

INVALID_PARAMS, INTERNAL_ERROR = -32602, -32603  # JSON-RPC 2.0
CLOSE_TIMEOUT_S = 15.0
# How long a tools/list answer from the service is reused.
CATALOG_MAX_AGE_S = 5.0


@dataclass
class Session:
    """What the server keeps for one MCP session."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    tx: AsyncTransaction | None = None
    users: int = 0  # calls holding or waiting for the lock; the entry is dropped at 0


@dataclass(frozen=True)
class Settings:
    target: str
    token: str | None = None
    tls: Any = None
    agent_id: str = "agenttx-mcp"
    metadata: Mapping[str, str] = field(default_factory=dict)


def _text(text: str, *, error: bool = False,
          structured: dict[str, Any] | None = None) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                structured_content=structured, is_error=error)


class Bridge:
    """Holds the client and the per-session transactions; builds the lowlevel Server."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # filled from the service's ListTools on the first tools/list (or tool call)
        self.catalog = Catalog(())
        self._catalog_at = 0.0
        self.sessions: dict[str, Session] = {}
        self._client: AsyncClient | None = None

    async def refresh_catalog(self, *, max_age_s: float = CATALOG_MAX_AGE_S) -> Catalog:
        """The tool list as the service has it now (ListTools), re-read when older than
        `max_age_s`, so a toolset published meanwhile shows up without a restart."""
        now = time.monotonic()
        if not self._catalog_at or now - self._catalog_at > max_age_s:
            self.catalog = Catalog(await self.client.tools())
            self._catalog_at = now
        return self.catalog

    # ---- plumbing ----------------------------------------------------------------------
    @property
    def client(self) -> AsyncClient:
        if self._client is None:
            self._client = AsyncClient(self.settings.target, token=self.settings.token,
                                       tls=self.settings.tls)
        return self._client

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
        then close the channel."""
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
        if self._client is not None:
            await self._client.close()
            self._client = None

    def server(self) -> Server[Any]:
        return Server(
            "agenttx", version=__version__, title="AgentTx",
            description="Transactions over an agent's tool calls", instructions=INSTRUCTIONS,
            lifespan=self.lifespan, get_tool_input_schema=self.catalog.input_schema,
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

    def _metadata(self, ctx: ServerRequestContext[Any, Any]) -> dict[str, str]:
        meta = dict(self.settings.metadata)
        params = ctx.session.client_params
        if params is not None and params.client_info is not None:
            meta.setdefault("mcp_client", params.client_info.name[:256])
        return meta

    async def _begin(self, ctx: ServerRequestContext[Any, Any]) -> AsyncTransaction:
        tx = await self.client.begin(agent_id=self.settings.agent_id, metadata=self._metadata(ctx))
        log.info("transaction begun for MCP", extra={"tx": tx.id,
                                                     "session": self.session_key(ctx)})
        return tx

    # ---- MCP handlers ------------------------------------------------------------------
    async def list_tools(self, ctx: ServerRequestContext[Any, Any],
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        try:
            found = await self.refresh_catalog()
        except AgentTxError as exc:
            raise MCPError(code=INTERNAL_ERROR, message=self._refused(exc)) from None
        return types.ListToolsResult(tools=found.tools())

    async def call_tool(self, ctx: ServerRequestContext[Any, Any],
                        params: types.CallToolRequestParams) -> types.CallToolResult:
        name = params.name
        args = dict(params.arguments or {})
        entry = self.catalog.entries.get(name)
        if entry is None and name not in self.catalog.control:
            try:  # a tool published since the last tools/list
                entry = (await self.refresh_catalog(max_age_s=0)).entries.get(name)
            except AgentTxError as exc:
                return _text(self._refused(exc), error=True)
        if entry is None and name not in self.catalog.control:
            raise MCPError(code=INVALID_PARAMS, message=f"Unknown tool: {name}")
        handle = args.pop(entry.handle if entry else catalog.HANDLE, None)
        if handle is not None and not isinstance(handle, str):
            return _text(f"`transaction` must be the handle string agenttx_begin returned, "
                         f"not {json.dumps(handle)}.", error=True)
        key = self.session_key(ctx)
        session = self.sessions.setdefault(key, Session()) if key else None
        if session is None:
            return await self._guarded(ctx, None, handle, entry, name, args)
        session.users += 1
        try:
            async with session.lock:  # one call at a time per session: step ids never race
                return await self._guarded(ctx, session, handle, entry, name, args)
        finally:
            session.users -= 1
            if key and session.users == 0 and session.tx is None:
                self.sessions.pop(key, None)

    async def _guarded(self, ctx: ServerRequestContext[Any, Any], session: Session | None,
                       handle: str | None, entry: catalog.Entry | None, name: str,
                       args: dict[str, Any]) -> types.CallToolResult:
        try:
            if entry is not None:
                return await self._step(ctx, session, handle, entry.agenttx_name, name, args)
            return await self._control(ctx, session, handle, name, args)
        except OutcomeUnknown as exc:
            if session is not None and exc.ended:
                session.tx = None
            return _text(f"{exc.details}. Call agenttx_status to see where the transaction "
                         "stands before doing anything else.", error=True)
        except NotFound as exc:
            if session is not None and session.tx is not None and \
                    (handle is None or handle == session.tx.id):
                session.tx = None
            return _text(f"The transaction no longer exists ({exc.details}): it was "
                         "committed, aborted, or expired after being idle. The next tool "
                         "call begins a new transaction.", error=True)
        except AgentTxError as exc:
            return _text(self._refused(exc), error=True)

    def _refused(self, exc: AgentTxError) -> str:
        """An RPC error in words the model can act on."""
        if exc.code.name in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
            return (f"The AgentTx service at {self.settings.target} is unreachable "
                    f"({exc.details}); try again later.")
        return f"AgentTx refused the call: {exc.code.name}: {exc.details}"

    # ---- transactions ------------------------------------------------------------------
    async def _resolve(self, ctx: ServerRequestContext[Any, Any], session: Session | None,
                       handle: str | None, *, begin: bool) -> tuple[AsyncTransaction | None, bool]:
        """The transaction a call acts on, and whether this call began it."""
        if handle:
            if session is not None and session.tx is not None and session.tx.id == handle:
                return session.tx, False
            return await self.client.attach(handle), False
        if session is not None:
            if session.tx is not None and not session.tx.finished:
                return session.tx, False
            if not begin:
                return None, False
            session.tx = await self._begin(ctx)
            return session.tx, True
        if not begin:
            return None, False
        return await self._begin(ctx), True

    @staticmethod
    def _began(tx: AsyncTransaction, session: Session | None) -> str:
        if session is not None:
            return f"Began transaction {tx.id}. "
        return (f"Began transaction {tx.id}; your client keeps no session, so pass "
                f"\"transaction\": \"{tx.id}\" to every later AgentTx tool call. ")

    async def _step(self, ctx: ServerRequestContext[Any, Any], session: Session | None,
                    handle: str | None, tool: str, exposed: str,
                    args: dict[str, Any]) -> types.CallToolResult:
        tx, began = await self._resolve(ctx, session, handle, begin=True)
        assert tx is not None
        r = await tx.step(tool, args)
        if session is not None and session.tx is tx and r.ended:
            session.tx = None
        prefix = self._began(tx, session) if began else ""
        return _text(prefix + step_text(r, exposed, tx.id), error=not r.ok,
                     structured=step_structured(r, tx.id))

    async def _control(self, ctx: ServerRequestContext[Any, Any], session: Session | None,
                       handle: str | None, name: str, args: dict[str, Any]) -> types.CallToolResult:
        if name == BEGIN:
            if args:
                return _text(f"agenttx_begin takes no arguments (got {', '.join(args)}).",
                             error=True)
            if session is not None and session.tx is not None and not session.tx.finished:
                tx = session.tx
                return _text(f"Transaction {tx.id} is already open (next step "
                             f"{tx.next_step_id}); commit it or roll it back first.",
                             error=True, structured={"transaction": tx.id})
            began = await self._begin(ctx)
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
        found, _ = await self._resolve(ctx, session, handle, begin=False)
        if found is None:
            verb = {STATUS: "show", COMMIT: "commit"}.get(name, "roll back")
            if session is None:
                return _text(f"Your client keeps no session: pass the handle agenttx_begin "
                             f"returned as `transaction` to say which transaction to {verb}.",
                             error=name != STATUS)
            if name == STATUS:
                return _text("No transaction is open; the next tool call begins one.")
            return _text(f"No transaction is open, so there is nothing to {verb}.", error=True)
        tx = found
        if name == STATUS:
            state = await tx.get()
            return _text(status_text(state), structured={"transaction": tx.id,
                                                         **_state_dict(state)})
        if name == COMMIT:
            try:
                done = await tx.commit()
            except Conflict as exc:
                if session is not None:
                    session.tx = None
                return _text(f"Commit failed: {exc.details}. Every step was undone and the "
                             "transaction ended: begin again and redo the work, reading the "
                             "data afresh.", error=True, structured={"transaction": tx.id,
                                                                      "committed": False})
            if session is not None and session.tx is tx:
                session.tx = None
            text = (f"Committed transaction {tx.id}: {_n(done.steps_committed, 'step')}, "
                    f"{_n(done.effects_dispatched, 'effect')} delivered.")
            if done.dispatch_errors:
                text += (" Some effects were not delivered yet and will be retried in the "
                         f"background: {'; '.join(done.dispatch_errors)}.")
            return _text(text, structured={"transaction": tx.id, "committed": done.committed,
                                           "steps_committed": done.steps_committed,
                                           "effects_dispatched": done.effects_dispatched,
                                           "dispatch_errors": list(done.dispatch_errors)})
        # ROLLBACK
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
        return _text(f"Aborted transaction {tx.id}: everything was undone "
                     f"({_n(result.compensations_run, 'undo action')}). The next tool call "
                     "begins a new transaction.", structured=structured)


# ---- what the model reads ----------------------------------------------------------------

def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _recovery(r: StepResult) -> str:
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
        return (f"The transaction was aborted ({r.abort_reason or 'no reason given'}) and "
                "everything was undone. The next tool call begins a new transaction.")
    if r.strategy is Strategy.MANUAL:
        return (f"Undoing failed ({'; '.join(r.compensation_errors)}). The transaction waits "
                "for a manual rollback: call agenttx_rollback (it resumes where the undo "
                "stopped); other steps and commit are refused until it succeeds.")
    return f"The next step is {nxt}."


def step_text(r: StepResult, tool: str, tx_id: str) -> str:
    if r.ok:
        return (f"Step {r.step_id} ({tool}) succeeded. Output: {r.output_json}\n"
                f"Next step: {r.next_step_id}; later steps can use this output as "
                f"\"${{steps.{r.step_id}.<field>}}\". Transaction {tx_id}.")
    lines = [f"Step {r.step_id} ({tool}) failed: {r.category}.",
             f"Hint: {r.hint}",
             f"Recovery ({r.strategy.value}): {_recovery(r)}"]
    if r.constraints and r.constraints != (r.hint,) and not r.ended:
        lines.append("Constraints learned so far (keep respecting them):")
        lines += [f"- {c}" for c in r.constraints]
    lines.append(f"Transaction {tx_id}.")
    return "\n".join(lines)


def step_structured(r: StepResult, tx_id: str) -> dict[str, Any]:
    if r.ok:
        return {"transaction": tx_id, "step_id": r.step_id, "next_step_id": r.next_step_id,
                "output": r.output}
    return {"transaction": tx_id, "step_id": r.step_id, "category": r.category, "hint": r.hint,
            "strategy": r.strategy.value, "rollback_to_step": r.rollback_to_step,
            "next_step_id": r.next_step_id, "context_reset": r.context_reset,
            "constraints": list(r.constraints), "abort_reason": r.abort_reason,
            "compensation_errors": list(r.compensation_errors)}


def _state_dict(v: TransactionState) -> dict[str, Any]:
    return {"status": v.status.value, "next_step_id": v.next_step_id,
            "global_resets": v.global_resets, "constraints": list(v.constraints),
            "context": [{"step_id": c.step_id, "tool_name": c.tool_name,
                         "raw_context": c.raw_context} for c in v.context]}


def status_text(v: TransactionState) -> str:
    lines = [f"Transaction {v.transaction_id}: {v.status.value}, next step {v.next_step_id}, "
             f"{v.global_resets} global resets."]
    if v.constraints:
        lines.append("Constraints learned so far:")
        lines += [f"- {c}" for c in v.constraints]
    if v.context:
        lines.append("Context log:")
        lines += [f"- step {c.step_id} ({catalog.mcp_name(c.tool_name)}): {c.raw_context}"
                  for c in v.context]
    return "\n".join(lines)
