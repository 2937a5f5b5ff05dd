"""The toolsets one replica serves: declared in `--toolsets-file` and published by the
operator under `<prefix>/toolsets/`, merged into one registry (docs/toolsets.md).

* **Merge.** A toolset is identified by `<namespace>/<name>`. When the file and etcd
  declare the same one, the file's wins (the replica's own configuration overrides what
  the cluster publishes, as a flag overrides the environment); the override is logged.
* **Scope** (docs/security.md): without authentication every caller sees every toolset;
  with it, a caller sees its own namespace's toolsets and the service namespace's
  (`--service-namespace`), or only its own when that is not set. A tool outside the
  caller's scope does not exist for it (`undefined_function`, with hints among the
  names it may use). Two visible toolsets offering one name: the caller's own namespace
  wins, then the lower `<ns>/<name>`; logged once.
* **Listings.** The upstream's `tools/list` (descriptions, input schemas) is fetched per
  toolset when it is loaded or changed, refreshed every `refresh_s`, and on demand when a
  step needs a schema it does not have. A broken toolset (bad record, upstream down) is
  logged and skipped, never fatal: its tools fail with `fdw_*` until it answers.

What it must never do: log or return a header value (only header names), or block the
event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mcp_types import Tool as McpTool

from ...contracts.toolsets import Toolset
from ..base import ToolError
from ..describe import ToolDescription
from ..registry import EVERYONE, Scope
from .schema import ArgumentSchema, InvalidSchema
from .tool import ToolsetTool, compensate, make_tool, undo_sentence
from .upstream import FDW_ERROR, Upstream, UpstreamError, where

log = logging.getLogger(__name__)

FILE, PUBLISHED = "file", "published"
# A step that names a tool its cached listing lacks refetches the listing, at most this
# often (the upstream may have added it since).
MISSING_TOOL_REFETCH_S = 5.0
# ListTools does not wait for an upstream whose listing failed this recently (it shows the
# tools with what the toolset declares; a step asks the upstream again).
LISTING_RETRY_S = 10.0


@dataclass
class Listing:
    tools: Mapping[str, McpTool]
    schemas: dict[str, ArgumentSchema | InvalidSchema]
    fetched_at: float


@dataclass
class Active:
    """One toolset in service: its record, its upstream, its tools, its listing."""

    toolset: Toolset
    source: str
    upstream: Upstream
    tools: dict[str, ToolsetTool]
    listing: Listing | None = None
    fetching: asyncio.Task[Listing] | None = field(default=None, repr=False)
    failed_at: float = -LISTING_RETRY_S

    async def fetch_listing(self) -> Listing:
        """The upstream's tools/list, fetched once however many callers wait for it."""
        task = self.fetching
        if task is None or task.done():
            task = self.fetching = asyncio.create_task(self._fetch(),
                                                       name=f"tools/list {self.toolset.key}")
        return await asyncio.shield(task)

    async def _fetch(self) -> Listing:
        tools = {t.name: t for t in await self.upstream.list_tools()}
        schemas: dict[str, ArgumentSchema | InvalidSchema] = {}
        for spec in self.toolset.tools:
            found = tools.get(spec.name)
            if found is None:
                continue
            try:
                schemas[spec.name] = ArgumentSchema(found.input_schema)
            except InvalidSchema as exc:
                schemas[spec.name] = exc
        missing = sorted(self.toolset.upstream_tools() - set(tools))
        if missing:
            log.warning("upstream does not list every tool the toolset names",
                        extra={"toolset": self.toolset.key, "missing": missing})
        self.listing = Listing(tools, schemas, time.monotonic())
        return self.listing

    async def schema(self, tool: str) -> ArgumentSchema:
        """The compiled inputSchema of `tool`, fetching the listing if needed. Raises
        ToolError (fdw_*) when the upstream cannot say."""
        try:
            listing = self.listing or await self.fetch_listing()
            if tool not in listing.schemas \
                    and time.monotonic() - listing.fetched_at > MISSING_TOOL_REFETCH_S:
                listing = await self.fetch_listing()
        except UpstreamError as exc:
            raise ToolError(exc.message, category=exc.category) from None
        found = listing.schemas.get(tool)
        if found is None:
            raise ToolError(f"{self.upstream.label} has no tool {tool} (toolset "
                            f"{self.toolset.key})", category=FDW_ERROR)
        if isinstance(found, InvalidSchema):
            raise ToolError(f"{self.upstream.label}: the input schema of {tool} is {found}",
                            category=FDW_ERROR)
        return found


def _same_upstream(a: Toolset, b: Toolset) -> bool:
    return a.upstream == b.upstream


class Toolsets:
    """The merged registry (see the module docstring). Mutated only by `set_file` /
    `set_published` (the watch loops), read by every step."""

    def __init__(self, *, service_namespace: str = "", max_connections: int = 16) -> None:
        self.service_namespace = service_namespace
        self.max_connections = max_connections
        self._file: dict[str, Toolset] = {}
        self._published: dict[str, Toolset] = {}
        self._active: dict[str, Active] = {}
        self._by_name: dict[str, list[Active]] = {}
        self._warned: set[tuple[str, ...]] = set()
        self._closing: set[asyncio.Task[None]] = set()

    # ---- sources ---------------------------------------------------------------------

    def set_file(self, toolsets: Iterable[Toolset]) -> None:
        self._file = {t.key: t for t in toolsets}
        self._merge()

    def set_published(self, key: str, toolset: Toolset | None) -> None:
        if toolset is None:
            self._published.pop(key, None)
        else:
            self._published[key] = toolset
        self._merge()

    def replace_published(self, toolsets: Mapping[str, Toolset]) -> None:
        self._published = dict(toolsets)
        self._merge()

    def _merge(self) -> None:
        wanted: dict[str, tuple[Toolset, str]] = {k: (t, PUBLISHED)
                                                  for k, t in self._published.items()}
        for key, t in self._file.items():
            if key in wanted and wanted[key][0] != t:
                log.warning("toolset from --toolsets-file overrides the published one",
                            extra={"toolset": key})
            wanted[key] = (t, FILE)
        for key in list(self._active):
            if key not in wanted:
                self._retire(self._active.pop(key))
                log.info("toolset removed", extra={"toolset": key})
        for key, (toolset, source) in wanted.items():
            current = self._active.get(key)
            if current is not None and current.toolset == toolset and current.source == source:
                continue
            if current is not None and _same_upstream(current.toolset, toolset):
                upstream = current.upstream
            else:
                if current is not None:
                    self._retire(current)
                upstream = Upstream(toolset.upstream.url, toolset.upstream.headers,
                                    toolset.upstream.timeout_s,
                                    max_connections=self.max_connections,
                                    label=f"toolset {key} ({where(toolset.upstream.url)})")
            tools = {toolset.agenttx_name(s.name): make_tool(self, key, toolset.prefix, s)
                     for s in toolset.tools}
            active = Active(toolset, source, upstream, tools)
            self._active[key] = active
            log.info("toolset changed" if current is not None else "toolset loaded",
                     extra={"toolset": key, "source": source, "prefix": toolset.prefix,
                            "generation": toolset.generation,
                            "upstream": where(toolset.upstream.url),
                            "headers": [h.name for h in toolset.upstream.headers],
                            "tools": {s.name: s.kind for s in toolset.tools}})
            self._prefetch(active)
        by_name: dict[str, list[Active]] = {}
        for key in sorted(self._active):
            for name in self._active[key].tools:
                by_name.setdefault(name, []).append(self._active[key])
        self._by_name = by_name

    def _prefetch(self, active: Active) -> None:
        """Fetch a new or changed toolset's listing in the background (logged, never
        fatal: a step that needs it asks again)."""
        with contextlib.suppress(RuntimeError):  # no running loop (a synchronous test)
            task = asyncio.get_running_loop().create_task(self._refresh_one(active))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _refresh_one(self, active: Active) -> None:
        try:
            await active.fetch_listing()
            return
        except UpstreamError as exc:
            error = exc.message
        except Exception as exc:  # a broken upstream must not take anything else down
            error = f"{type(exc).__name__}: {exc}"[:300]
        active.failed_at = time.monotonic()
        log.warning("toolset upstream did not list its tools",
                    extra={"toolset": active.toolset.key, "error": error})

    def _retire(self, active: Active) -> None:
        if any(a.upstream is active.upstream for a in self._active.values()):
            return
        with contextlib.suppress(RuntimeError):
            task = asyncio.get_running_loop().create_task(active.upstream.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def refresh(self) -> None:
        """Refetch every toolset's listing (the periodic refresh)."""
        await asyncio.gather(*(self._refresh_one(a) for a in list(self._active.values())))

    async def close(self) -> None:
        actives, self._active, self._by_name = list(self._active.values()), {}, {}
        for task in list(self._closing):
            task.cancel()
        await asyncio.gather(*(a.upstream.close() for a in actives), return_exceptions=True)

    # ---- lookups ---------------------------------------------------------------------

    def current(self, key: str) -> Active | None:
        return self._active.get(key)

    def keys(self) -> list[str]:
        return sorted(self._active)

    def _visible(self, active: Active, scope: Scope) -> bool:
        if not scope.authenticated:
            return True
        ns = active.toolset.namespace
        return ns == scope.namespace or bool(self.service_namespace) \
            and ns == self.service_namespace

    def _pick(self, name: str, candidates: list[Active], scope: Scope) -> Active:
        if len(candidates) == 1:
            return candidates[0]
        chosen = sorted(candidates, key=lambda a: (a.toolset.namespace != scope.namespace,
                                                   a.toolset.key))[0]
        clash = tuple(a.toolset.key for a in candidates)
        if clash not in self._warned:
            self._warned.add(clash)
            log.warning("two toolsets offer the same tool name",
                        extra={"tool": name, "toolsets": list(clash),
                               "chosen": chosen.toolset.key})
        return chosen

    def tool(self, name: str, scope: Scope) -> ToolsetTool | None:
        """The toolset tool `name` as `scope` sees it, or None."""
        candidates = [a for a in self._by_name.get(name, ()) if self._visible(a, scope)]
        if not candidates:
            return None
        return self._pick(name, candidates, scope).tools[name]

    def any_tool(self, name: str) -> ToolsetTool | None:
        """A toolset tool by name whatever the scope (undo, metric labels: the step was
        in scope when it ran; its compensation names its toolset itself)."""
        found = self._by_name.get(name)
        return found[0].tools[name] if found else None

    def names(self, scope: Scope) -> list[str]:
        return sorted(n for n, actives in self._by_name.items()
                      if any(self._visible(a, scope) for a in actives))

    async def describe(self, scope: Scope) -> list[ToolDescription]:
        """ListTools' entries for the toolsets in scope (listings fetched if missing)."""
        visible = [a for a in self._active.values() if self._visible(a, scope)]
        now = time.monotonic()
        await asyncio.gather(*(self._refresh_one(a) for a in visible if a.listing is None
                               and now - a.failed_at >= LISTING_RETRY_S))
        out: list[ToolDescription] = []
        for name in self.names(scope):
            tool = self.tool(name, scope)
            if tool is None:
                continue
            active = self._active[tool.toolset_key]
            listed = active.listing.tools.get(tool.spec.name) if active.listing else None
            upstream_text = (listed.description or "").strip() if listed else ""
            sentence = undo_sentence(tool.spec)
            description = f"{upstream_text} {sentence}".strip() if upstream_text else sentence
            schema = listed.input_schema if listed else {"type": "object"}
            out.append(ToolDescription(name, description,
                                       json.dumps(schema, separators=(",", ":"),
                                                  sort_keys=True),
                                       tool.spec.kind, tool.toolset_key))
        return out

    # ---- after commit ----------------------------------------------------------------

    async def deliver(self, toolset_key: str, tool: str, arguments: Any,
                      idempotency_key: str) -> None:
        """Make a committed deferred call (`tool` as the upstream names it). Raises
        UpstreamError (its `permanent` says whether retrying can help)."""
        active = self._active.get(toolset_key)
        if active is None:
            raise UpstreamError(FDW_ERROR, f"toolset {toolset_key} is not loaded on this "
                                "replica", permanent=False, maybe_applied=False)
        await active.upstream.call(tool, arguments if isinstance(arguments, Mapping) else {},
                                   idempotency_key)

    async def compensate(self, doc: Any) -> None:
        await compensate(self, doc)


__all__ = ["EVERYONE", "Active", "Listing", "Scope", "Toolsets"]
