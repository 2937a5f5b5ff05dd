"""`ticket.create`: a SAGA tool. It writes a ticket file now and deletes it on undo.

A SAGA tool acts on the outside world during `execute` (other processes can see the
ticket before the transaction commits) and returns a `compensation`: plain JSON that the
engine stores durably with the step and hands back to `compensate` if the step is ever
undone, on whichever replica does the undo. Hence the rules this file follows:

- the compensation carries everything the undo needs (an absolute path, a content hash),
  never in-process state;
- `compensate` is idempotent (an absent file is a success: a retried rollback, after a
  crash or a MANUAL stop, must not fail on work already done) and removes the file only
  if it is still the one this step wrote, so it never deletes another transaction's
  ticket that reused the id;
- failures are worded like PostgreSQL (a duplicate id raises exactly what a primary key
  would), so the error cleaner classifies them as it does the built-ins' errors.

The ticket directory must be visible to every replica (in Kubernetes: a shared volume).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import pathlib
import uuid
from typing import Any, Literal

from pydantic import Field

from agenttx.tools.base import RollbackKind, Tool, ToolArguments, ToolContext, ToolError, ToolResult

TICKETS_DIR_ENV = "AGENTTX_EXAMPLE_TICKETS_DIR"


class TicketArguments(ToolArguments):
    """Arguments of `ticket.create`. Validation errors reach the agent serde-style, e.g.
    ``invalid value: string "../x", expected a string matching ^[A-Za-z0-9_-]{1,64}$``."""

    id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="the ticket id, unique")
    title: str = Field(min_length=1, max_length=200)
    body: str = ""
    priority: Literal["low", "normal", "high"] = "normal"


def tickets_dir(ctx: ToolContext) -> pathlib.Path:
    """$AGENTTX_EXAMPLE_TICKETS_DIR, else `tickets/` under the transaction's sandbox root."""
    configured = os.environ.get(TICKETS_DIR_ENV)
    return pathlib.Path(configured) if configured else pathlib.Path(ctx.fs_root) / "tickets"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fsync_dir(directory: pathlib.Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _create_exclusive(path: pathlib.Path, data: bytes) -> bool:
    """Atomically create `path` holding `data`; False if it already exists.

    Write a temp file, fsync it, then hard-link it into place: link() fails if the name
    exists, so two transactions creating the same id cannot both succeed, and a reader
    never sees a half-written ticket."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        _fsync_dir(path.parent)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _remove_if_ours(path: pathlib.Path, sha256: str) -> None:
    try:
        current = path.read_bytes()
    except FileNotFoundError:
        return  # already undone: idempotent
    if _sha256(current) != sha256:
        return  # someone else's ticket now carries this id: not ours to delete
    path.unlink(missing_ok=True)
    _fsync_dir(path.parent)


class CreateTicket(Tool):
    name = "ticket.create"
    # Shown to models as the MCP tool's description (`agenttx mcp`); optional.
    description = ("Open a support ticket (a JSON file visible to other systems at once); "
                   "a duplicate id fails like a primary key.")
    fields = TicketArguments
    rollback = RollbackKind.SAGA

    async def execute(self, args: TicketArguments, ctx: ToolContext) -> ToolResult:
        path = tickets_dir(ctx) / f"{args.id}.json"
        ticket = {"id": args.id, "title": args.title, "body": args.body,
                  "priority": args.priority, "transaction_id": ctx.tx_id, "step": ctx.step_id}
        data = json.dumps(ticket, ensure_ascii=False, sort_keys=True).encode()
        try:
            created = await asyncio.to_thread(_create_exclusive, path, data)
        except OSError as exc:  # POSIX wording, which the cleaner also knows
            raise ToolError(f"{exc.strerror or exc}: '{path.name}'", argument="id") from None
        if not created:
            raise ToolError(
                'duplicate key value violates unique constraint "tickets_pkey"\n'
                f"DETAIL:  Key (id)=({args.id}) already exists.", argument="id")
        return ToolResult(
            output={"id": args.id, "title": args.title, "priority": args.priority},
            compensation={"path": str(path), "sha256": _sha256(data)})

    async def compensate(self, compensation: Any) -> None:
        await asyncio.to_thread(_remove_if_ours, pathlib.Path(compensation["path"]),
                                compensation["sha256"])
