"""Which tools exist: the built-ins plus those registered under the `agenttx.tools`
entry-point group by installed packages. Loaded once at start-up; a broken plug-in is
logged and skipped, never fatal, and can never shadow a built-in.

A plug-in's shape is checked when it is added (rollback kind, argument model, a real
`compensate` for SAGA tools), so a mistake shows up in the start-up log rather than as
a failed undo in the middle of someone's rollback."""

from __future__ import annotations

import logging
from importlib.metadata import entry_points

from pydantic import BaseModel

from .base import Field, RollbackKind, Tool
from .builtin import BUILTIN_TOOLS

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "agenttx.tools"


class ToolRegistry:
    def __init__(self, tools: list[Tool]) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.add(tool)

    def add(self, tool: Tool) -> None:
        if not tool.name:
            raise ValueError(f"tool {type(tool).__name__} has no name")
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is registered twice")
        if not isinstance(tool.rollback, RollbackKind):
            raise ValueError(f"tool {tool.name!r}: rollback must be a RollbackKind, "
                             f"got {tool.rollback!r}")
        model = tool.fields
        if not ((isinstance(model, type) and issubclass(model, BaseModel))
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
        return self._tools.get(name)

    def names(self) -> list[str]:
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
