"""Which tools exist: the built-ins plus those registered under the `agenttx.tools`
entry-point group by installed packages. Loaded once at start-up; a broken plug-in is
logged and skipped, never fatal, and can never shadow a built-in.

A plug-in's shape is checked when it is added (rollback kind, argument model, a real
`compensate` for SAGA tools), so a mistake shows up in the start-up log rather than as
a failed undo in the middle of someone's rollback."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel

from .base import Field, RollbackKind, Tool
from .builtin import BUILTIN_TOOLS

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "agenttx.tools"

if TYPE_CHECKING:
    from .describe import ToolDescription


@dataclass(frozen=True)
class Scope:
    """Who is asking, as far as which tools exist for them (docs/security.md): toolsets
    are scoped by namespace once authentication is on."""

    authenticated: bool = False
    namespace: str | None = None


EVERYONE = Scope()


class ToolSource(Protocol):
    """Tools that come and go at run time, by caller scope (the toolsets)."""

    def tool(self, name: str, scope: Scope) -> Tool | None: ...
    def any_tool(self, name: str) -> Tool | None: ...
    def names(self, scope: Scope) -> list[str]: ...
    async def describe(self, scope: Scope) -> Sequence[ToolDescription]: ...


class ToolRegistry:
    def __init__(self, tools: list[Tool]) -> None:
        self._tools: dict[str, Tool] = {}
        self.source: ToolSource | None = None
        for tool in tools:
            self.add(tool)

    def attach(self, source: ToolSource) -> None:
        """Add tools that are resolved per caller (toolsets). Built-ins and plug-ins
        always win: a toolset can never shadow them (its prefix cannot be theirs)."""
        self.source = source

    def lookup(self, name: str, scope: Scope) -> Tool | None:
        """The tool `name` as a caller with `scope` sees it."""
        found = self._tools.get(name)
        if found is None and self.source is not None:
            return self.source.tool(name, scope)
        return found

    def names_in(self, scope: Scope) -> list[str]:
        """Every tool name a caller with `scope` may use (hints for unknown tools)."""
        if self.source is None:
            return self.names()
        return sorted({*self._tools, *self.source.names(scope)})

    def add(self, tool: Tool) -> None:
        if not tool.name:
            raise ValueError(f"tool {type(tool).__name__} has no name")
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is registered twice")
        if not isinstance(tool.rollback, RollbackKind):
            raise ValueError(f"tool {tool.name!r}: rollback must be a RollbackKind, "
                             f"got {tool.rollback!r}")
        model = tool.fields
        if model is None or not ((isinstance(model, type) and issubclass(model, BaseModel))
                                 or (not isinstance(model, str | type)
                                     and all(isinstance(f, Field) for f in model))):
            raise ValueError(f"tool {tool.name!r}: fields must be a pydantic model class or "
                             "a sequence of agenttx.tools.base.Field")
        if tool.rollback is RollbackKind.SAGA and tool.name != "fs.write" \
                and type(tool).compensate is Tool.compensate:
            raise ValueError(f"tool {tool.name!r} is a SAGA tool but does not implement "
                             "compensate()")
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        """A tool by name, whatever the scope (undo of a step that ran, metric labels)."""
        found = self._tools.get(name)
        if found is None and self.source is not None:
            return self.source.any_tool(name)
        return found

    def names(self) -> list[str]:
        """The built-ins and plug-ins."""
        return sorted(self._tools)

    @classmethod
    def load(cls, *, plugins: bool = True) -> ToolRegistry:
        registry = cls([t() for t in BUILTIN_TOOLS])
        if not plugins:
            return registry
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                obj = ep.load()
                tool = obj() if isinstance(obj, type) else obj
                if not isinstance(tool, Tool):
                    raise TypeError(f"{ep.value} is not an agenttx.tools.Tool")
                registry.add(tool)
                log.info("loaded tool plug-in", extra={"tool": tool.name, "entry_point": ep.value})
            except Exception as exc:  # a broken plug-in must not take the service down
                log.error("skipping tool plug-in",
                          extra={"entry_point": ep.name, "error": f"{type(exc).__name__}: {exc}"})
        return registry
