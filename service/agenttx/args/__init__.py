"""Step arguments: parse `arguments_json` like serde_json, resolve `${steps.N.path}` references.

Why a package of its own: the servicer, the engine and the tools all need these pure
functions, and they sit below every one of them (`api -> engine -> tools -> args`). It must
never import from `agenttx.engine`, `agenttx.tools`, `agenttx.store`, grpc or aetcd, and
never do I/O. Everything here is linear in the size of its input (SPEC §3).
"""

from .jsonargs import MAX_DEPTH, ArgumentsError, describe, dumps, json_depth, parse_arguments
from .refs import (
    MAX_EXPANSION,
    OverBudget,
    Reference,
    ReferenceError_,
    Resolution,
    find_references,
    has_reference,
    offending_step,
    resolve,
)

__all__ = [
    "MAX_DEPTH", "MAX_EXPANSION", "ArgumentsError", "OverBudget", "Reference", "ReferenceError_",
    "Resolution", "describe", "dumps", "find_references", "has_reference", "json_depth",
    "offending_step", "parse_arguments", "resolve",
]
