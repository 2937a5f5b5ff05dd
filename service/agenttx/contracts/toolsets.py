"""Toolsets: an MCP server's tools declared transactional (docs/toolsets.md).

The one typed record both sources publish: the operator (from an `AgentTxToolset`
resource, to `<prefix>/toolsets/<ns>/<name>` in etcd) and `--toolsets-file` (read by
each replica). Its spec is the CRD's `spec`, camelCase as users write it:

    upstream:
      url: http://tickets.team-a.svc:8080/mcp
      headers:
        - {name: Authorization, secretKeyRef: {name: tickets-token, key: header}}  # CRD
        - {name: Authorization, file: /path}                                       # file
        - {name: X-Test, value: literal}                                           # file
      timeoutSeconds: 10
    prefix: tickets
    tools:
      - {name: create_ticket, kind: saga,
         compensate: {tool: close_ticket, arguments: {id: "${output.id}"}}}
      - {name: send_email, kind: deferred}
      - {name: search_tickets, kind: read}

Secrets never enter this record's published form: a header names a file (a Secret key
the operator projects into the service pods read-only); a literal `value` is allowed in
the file form only and is refused by `to_json`. The ranges here are the CRD schema's (a
test checks the CRD, the chart's copy and this module agree).

Pure: no I/O. The operator imports this module, never the engine.
"""

from __future__ import annotations

import json
import math
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

KINDS = ("read", "saga", "deferred")
DEFAULT_TIMEOUT_S = 10.0
TIMEOUT_MIN_S, TIMEOUT_MAX_S = 1.0, 300.0
# A prefix is the first part of every tool name the toolset adds (`tickets.create_ticket`);
# the built-ins' and the MCP server's own names are taken.
PREFIX_PATTERN = r"^[a-z][a-z0-9_]{0,31}$"
RESERVED_PREFIXES = frozenset({"kv", "record", "fs", "effect", "agenttx"})
# MCP tool names (the 2025-11-25 revision: 1-128 of A-Z a-z 0-9 _ - .).
TOOL_NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,128}$"
# AgentTx's own limit on tool_name (docs/api.md): `<prefix>.<tool>` must fit.
MAX_TOOL_NAME_BYTES = 128
MAX_TOOLS = 256
MAX_HEADERS = 16
HEADER_NAME_PATTERN = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$"    # an HTTP token (RFC 9110)
RESERVED_HEADERS = frozenset({"content-type", "content-length", "host", "accept",
                              "mcp-session-id", "mcp-protocol-version"})
# `${arguments.path}` / `${output.path}` in a compensation's arguments.
COMPENSATION_REFERENCE = re.compile(r"\$\{(arguments|output)((?:\.[^.}]+)*)\}")

_PREFIX = re.compile(PREFIX_PATTERN)
_TOOL = re.compile(TOOL_NAME_PATTERN)
_HEADER = re.compile(HEADER_NAME_PATTERN)


class ToolsetError(ValueError):
    """An invalid toolset; the message names the field (`spec.tools[1].compensate`)."""


@dataclass(frozen=True)
class Header:
    """One request header sent to the upstream. Exactly one of `file` (a path whose
    contents, stripped of a trailing newline, are the value) and `value` (file form only;
    a secret like any other) is set."""

    name: str
    file: str | None = None
    value: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Upstream:
    url: str
    headers: tuple[Header, ...] = ()
    timeout_s: float = DEFAULT_TIMEOUT_S


@dataclass(frozen=True)
class Compensation:
    tool: str
    arguments: Mapping[str, Any] = field(default_factory=dict)

    @property
    def from_arguments_only(self) -> bool:
        """True when the compensation can be built without the step's output (only
        `${arguments.…}` references): after a crash mid-call it can still be run."""
        return not any(m.group(1) == "output" for m in _references(self.arguments))


@dataclass(frozen=True)
class ToolSpec:
    name: str                       # the upstream's tool name
    kind: str                       # read | saga | deferred
    compensate: Compensation | None = None


@dataclass(frozen=True)
class Toolset:
    namespace: str
    name: str
    generation: int
    upstream: Upstream
    prefix: str
    tools: tuple[ToolSpec, ...]

    @property
    def key(self) -> str:
        """`<ns>/<name>`: the toolset's identity, its etcd key suffix, `ToolInfo.toolset`."""
        return f"{self.namespace}/{self.name}"

    def agenttx_name(self, tool: str) -> str:
        return f"{self.prefix}.{tool}"

    def upstream_tools(self) -> set[str]:
        """Every upstream tool this toolset calls: its tools and their compensations."""
        names = {t.name for t in self.tools}
        names |= {t.compensate.tool for t in self.tools if t.compensate is not None}
        return names


# ---- parsing ------------------------------------------------------------------------

def _references(doc: Any) -> list[re.Match[str]]:
    if isinstance(doc, str):
        return list(COMPENSATION_REFERENCE.finditer(doc))
    if isinstance(doc, Mapping):
        return [m for v in doc.values() for m in _references(v)]
    if isinstance(doc, list | tuple):
        return [m for v in doc for m in _references(v)]
    return []


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ToolsetError(f"{where} must be an object, got {_kind(value)}")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ToolsetError(f"{where} must be a non-empty string, got {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _only(doc: Mapping[str, Any], allowed: Sequence[str], where: str) -> None:
    unknown = sorted(set(doc) - set(allowed))
    if unknown:
        raise ToolsetError(f"{where}: unknown field(s) {', '.join(unknown)} "
                           f"(expected {', '.join(allowed)})")


def _url(value: Any, where: str) -> str:
    url = _string(value, where)
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ToolsetError(f"{where} must be an absolute http:// or https:// URL, got {url!r}")
    if parts.username or parts.password:
        raise ToolsetError(f"{where} must not carry credentials; use a header from a Secret")
    return url


SecretPath = Callable[[str, str], str]


def _header(doc: Any, where: str, secret_path: SecretPath | None, *,
            allow_value: bool) -> Header:
    d = _object(doc, where)
    _only(d, ("name", "secretKeyRef", "file", "value"), where)
    name = _string(d.get("name"), f"{where}.name")
    if not _HEADER.match(name):
        raise ToolsetError(f"{where}.name {name!r} is not an HTTP header name")
    if name.lower() in RESERVED_HEADERS:
        raise ToolsetError(f"{where}.name {name!r} is set by AgentTx and may not be given")
    sources = [k for k in ("secretKeyRef", "file", "value") if k in d]
    if len(sources) != 1:
        raise ToolsetError(f"{where} needs exactly one of secretKeyRef, file or value")
    source = sources[0]
    if source == "secretKeyRef":
        ref = _object(d["secretKeyRef"], f"{where}.secretKeyRef")
        _only(ref, ("name", "key"), f"{where}.secretKeyRef")
        secret = _string(ref.get("name"), f"{where}.secretKeyRef.name")
        key = _string(ref.get("key"), f"{where}.secretKeyRef.key")
        if secret_path is None:
            raise ToolsetError(f"{where}.secretKeyRef needs Kubernetes; in a toolsets file "
                               "give the header as {name, file} instead")
        return Header(name, file=secret_path(secret, key))
    if source == "file":
        path = _string(d["file"], f"{where}.file")
        if not path.startswith("/"):
            raise ToolsetError(f"{where}.file must be an absolute path, got {path!r}")
        return Header(name, file=path)
    if not allow_value:
        raise ToolsetError(f"{where}.value is not allowed here: take the value from a Secret")
    if not isinstance(d["value"], str):
        raise ToolsetError(f"{where}.value must be a string, got {_kind(d['value'])}")
    return Header(name, value=d["value"])


def _timeout(value: Any, where: str) -> float:
    if value is None:
        return DEFAULT_TIMEOUT_S
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or not TIMEOUT_MIN_S <= value <= TIMEOUT_MAX_S:
        raise ToolsetError(f"{where} must be a number of seconds between {TIMEOUT_MIN_S:g} "
                           f"and {TIMEOUT_MAX_S:g}, got {value!r}")
    return float(value)


def _tool(doc: Any, where: str, prefix: str) -> ToolSpec:
    d = _object(doc, where)
    _only(d, ("name", "kind", "compensate"), where)
    name = _string(d.get("name"), f"{where}.name")
    if not _TOOL.match(name):
        raise ToolsetError(f"{where}.name {name!r} is not an MCP tool name "
                           "(1-128 of A-Z, a-z, 0-9, _, - and .)")
    if len(f"{prefix}.{name}".encode()) > MAX_TOOL_NAME_BYTES:
        raise ToolsetError(f"{where}.name: {prefix}.{name} is longer than "
                           f"{MAX_TOOL_NAME_BYTES} bytes")
    kind = d.get("kind")
    if kind not in KINDS:
        raise ToolsetError(f"{where}.kind must be one of {', '.join(KINDS)}, got {kind!r}")
    comp = d.get("compensate")
    if kind == "saga":
        if comp is None:
            raise ToolsetError(f"{where}.compensate is required for kind saga (how is "
                               f"{name} undone?)")
        c = _object(comp, f"{where}.compensate")
        _only(c, ("tool", "arguments"), f"{where}.compensate")
        tool = _string(c.get("tool"), f"{where}.compensate.tool")
        if not _TOOL.match(tool):
            raise ToolsetError(f"{where}.compensate.tool {tool!r} is not an MCP tool name")
        args = _object(c.get("arguments", {}), f"{where}.compensate.arguments")
        return ToolSpec(name, kind, Compensation(tool, args))
    if comp is not None:
        raise ToolsetError(f"{where}.compensate is only for kind saga ({kind} tools are "
                           f"{'never undone' if kind == 'read' else 'called after commit'})")
    return ToolSpec(name, kind)


def from_spec(namespace: Any, name: Any, generation: Any, spec: Any, *,
              secret_path: SecretPath | None = None, allow_values: bool = False) -> Toolset:
    """The toolset declared by `spec` (a CRD's `.spec`, or one entry of a toolsets file).

    `secret_path(secret, key)` maps a `secretKeyRef` to the file the operator projects it
    to (None: not on Kubernetes, a secretKeyRef is an error). `allow_values` admits
    literal header values (the file form). Raises ToolsetError naming the field."""
    for what, value in (("namespace", namespace), ("name", name)):
        if not isinstance(value, str) or not value:
            raise ToolsetError(f"{what} must be a non-empty string, got {value!r}")
    s = _object(spec, "spec")
    _only(s, ("upstream", "prefix", "tools"), "spec")
    up = _object(s.get("upstream"), "spec.upstream")
    _only(up, ("url", "headers", "timeoutSeconds"), "spec.upstream")
    raw_headers = up.get("headers", [])
    if not isinstance(raw_headers, list) or len(raw_headers) > MAX_HEADERS:
        raise ToolsetError(f"spec.upstream.headers must be a list of at most {MAX_HEADERS}")
    headers = tuple(_header(h, f"spec.upstream.headers[{i}]", secret_path,
                            allow_value=allow_values) for i, h in enumerate(raw_headers))
    seen_headers = [h.name.lower() for h in headers]
    if len(set(seen_headers)) != len(seen_headers):
        raise ToolsetError("spec.upstream.headers names a header twice")
    upstream = Upstream(_url(up.get("url"), "spec.upstream.url"), headers,
                        _timeout(up.get("timeoutSeconds"), "spec.upstream.timeoutSeconds"))
    prefix = _string(s.get("prefix"), "spec.prefix")
    if not _PREFIX.match(prefix):
        raise ToolsetError(f"spec.prefix {prefix!r} must match {PREFIX_PATTERN}")
    if prefix in RESERVED_PREFIXES:
        raise ToolsetError(f"spec.prefix {prefix!r} is taken by AgentTx's own tools")
    raw_tools = s.get("tools")
    if not isinstance(raw_tools, list) or not raw_tools or len(raw_tools) > MAX_TOOLS:
        raise ToolsetError(f"spec.tools must list 1 to {MAX_TOOLS} tools")
    tools = tuple(_tool(t, f"spec.tools[{i}]", prefix) for i, t in enumerate(raw_tools))
    names = [t.name for t in tools]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ToolsetError(f"spec.tools lists {', '.join(dup)} more than once")
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
        raise ToolsetError(f"generation must be an integer >= 0, got {generation!r}")
    return Toolset(namespace, name, generation, upstream, prefix, tools)


def to_spec(t: Toolset) -> dict[str, Any]:
    """The spec as written (camelCase; headers as files or values)."""
    headers: list[dict[str, Any]] = []
    for h in t.upstream.headers:
        headers.append({"name": h.name, "file": h.file} if h.file is not None
                       else {"name": h.name, "value": h.value})
    tools: list[dict[str, Any]] = []
    for tool in t.tools:
        doc: dict[str, Any] = {"name": tool.name, "kind": tool.kind}
        if tool.compensate is not None:
            doc["compensate"] = {"tool": tool.compensate.tool,
                                 "arguments": dict(tool.compensate.arguments)}
        tools.append(doc)
    return {"upstream": {"url": t.upstream.url, "headers": headers,
                         "timeoutSeconds": t.upstream.timeout_s},
            "prefix": t.prefix, "tools": tools}


def to_json(t: Toolset) -> bytes:
    """The published form (etcd). Refuses a literal header value: no secret in etcd."""
    if any(h.value is not None for h in t.upstream.headers):
        raise ToolsetError(f"toolset {t.key}: a literal header value is never published; "
                           "take it from a Secret")
    doc = {"namespace": t.namespace, "name": t.name, "generation": t.generation,
           "spec": to_spec(t)}
    return json.dumps(doc, separators=(",", ":"), sort_keys=True, ensure_ascii=False,
                      allow_nan=False).encode()


def parse_published(raw: bytes) -> Toolset:
    """The inverse of `to_json`. Raises ToolsetError on anything malformed."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ToolsetError(f"invalid published toolset: {exc}") from None
    top = _object(doc, "toolset")
    return from_spec(top.get("namespace"), top.get("name"), top.get("generation", 0),
                     top.get("spec"))


def parse_file(doc: Any) -> list[Toolset]:
    """A `--toolsets-file` document, already read from YAML or JSON:
    `{"toolsets": [{"namespace": "default", "name": "...", "spec": {...}}]}`."""
    top = _object(doc, "toolsets file")
    _only(top, ("toolsets",), "toolsets file")
    entries = top.get("toolsets", [])
    if not isinstance(entries, list):
        raise ToolsetError("toolsets file: toolsets must be a list")
    out: list[Toolset] = []
    for i, entry in enumerate(entries):
        e = _object(entry, f"toolsets[{i}]")
        _only(e, ("namespace", "name", "spec"), f"toolsets[{i}]")
        try:
            out.append(from_spec(e.get("namespace", "default"), e.get("name"), 0, e.get("spec"),
                                 allow_values=True))
        except ToolsetError as exc:
            raise ToolsetError(f"toolsets[{i}] ({e.get('name')!r}): {exc}") from None
    keys = [t.key for t in out]
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise ToolsetError(f"toolsets file: {', '.join(dup)} declared more than once")
    return out


def resolve_compensation(arguments: Any, *, call_arguments: Mapping[str, Any],
                         output: Any) -> Any:
    """A compensation's arguments with `${arguments.…}` / `${output.…}` replaced: a whole-
    string reference keeps the JSON type of what it names (as `${steps.N.…}` does), an
    embedded one is interpolated as text. Raises KeyError naming a path that does not
    exist."""
    roots = {"arguments": call_arguments, "output": output}

    def lookup(root: str, path: str) -> Any:
        value: Any = roots[root]
        for part in [p for p in path.split(".") if p]:
            if isinstance(value, Mapping) and part in value:
                value = value[part]
            elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                value = value[int(part)]
            else:
                raise KeyError(f"${{{root}{path}}}")
        return value

    def walk(node: Any) -> Any:
        if isinstance(node, str):
            whole = COMPENSATION_REFERENCE.fullmatch(node)
            if whole:
                return lookup(whole.group(1), whole.group(2))
            return COMPENSATION_REFERENCE.sub(
                lambda m: _text(lookup(m.group(1), m.group(2))), node)
        if isinstance(node, Mapping):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(arguments)


def header_value(raw: bytes, where: str = "header value") -> str:
    """A header's value as read from its file (a projected Secret key): UTF-8, with the
    trailing line breaks dropped (`echo` and most editors add one). Both the operator
    (for its tools/list) and the service (for every call) read header files this way.

    Raises ToolsetError when it cannot be sent as an HTTP field value (RFC 9110: no
    control characters but tab); the message never quotes the value, which is a secret.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolsetError(f"{where} is not UTF-8 text") from None
    text = text.rstrip("\r\n")
    bad = [c for c in text if (ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F]
    if bad:
        raise ToolsetError(f"{where} contains a control character (e.g. a line break inside "
                           "it); an HTTP header value cannot")
    if not text.strip():
        raise ToolsetError(f"{where} is empty")
    return text


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


__all__ = ["DEFAULT_TIMEOUT_S", "KINDS", "PREFIX_PATTERN", "RESERVED_PREFIXES",
           "TIMEOUT_MAX_S", "TIMEOUT_MIN_S", "Compensation", "Header", "ToolSpec", "Toolset",
           "ToolsetError", "Upstream", "from_spec", "header_value", "parse_file", "parse_published",
           "resolve_compensation", "to_json", "to_spec"]
