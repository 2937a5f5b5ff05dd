"""Toolsets: the tools of any MCP server joining AgentTx transactions (docs/toolsets.md).

`registry.Toolsets` holds the toolsets a replica serves (from `--toolsets-file` and the
operator's published records) and resolves tool names by caller scope; `tool` puts each
toolset tool behind the ordinary Tool interface (read, saga, deferred); `upstream` makes
the MCP calls; `schema` checks arguments against the upstream's input schema. The engine
sees only Tools: it imports nothing of the `mcp` SDK.
"""

from ..registry import EVERYONE, Scope
from .registry import Toolsets
from .tool import CompensationFailed, ToolsetTool
from .upstream import Upstream, UpstreamError

__all__ = ["EVERYONE", "CompensationFailed", "Scope", "ToolsetTool",
           "Toolsets", "Upstream", "UpstreamError"]
