"""The toolset record (agenttx.contracts.toolsets): what a spec may say, what is refused
and why, the published form (never a secret), and compensation argument resolution."""

from __future__ import annotations

import json

import pytest

from agenttx.contracts.toolsets import (
    ToolsetError,
    from_spec,
    header_value,
    parse_file,
    parse_published,
    resolve_compensation,
    to_json,
)

SPEC = {
    "upstream": {"url": "http://tickets.team-a.svc:8080/mcp",
                 "headers": [{"name": "Authorization", "file": "/etc/agenttx/t/header"}],
                 "timeoutSeconds": 5},
    "prefix": "tickets",
    "tools": [
        {"name": "create_ticket", "kind": "saga",
         "compensate": {"tool": "close_ticket",
                        "arguments": {"id": "${output.id}", "reason": "rolled back"}}},
        {"name": "send_email", "kind": "deferred"},
        {"name": "search_tickets", "kind": "read"},
    ],
}


def test_a_valid_spec_round_trips_through_the_published_form():
    t = from_spec("team-a", "tickets", 3, SPEC)
    assert t.key == "team-a/tickets"
    assert t.agenttx_name("create_ticket") == "tickets.create_ticket"
    assert t.upstream.timeout_s == 5.0
    assert t.upstream_tools() == {"create_ticket", "close_ticket", "send_email", "search_tickets"}
    assert t.tools[0].compensate is not None and not t.tools[0].compensate.from_arguments_only
    assert parse_published(to_json(t)) == t


def test_defaults_timeout_and_headers():
    spec = {**SPEC, "upstream": {"url": "https://x.example/mcp"}}
    t = from_spec("ns", "n", 0, spec)
    assert (t.upstream.timeout_s, t.upstream.headers) == (10.0, ())


@pytest.mark.parametrize(("change", "message"), [
    ({"prefix": "kv"}, "spec.prefix 'kv' is taken by AgentTx's own tools"),
    ({"prefix": "Tickets"}, "spec.prefix 'Tickets' must match"),
    ({"tools": []}, "spec.tools must list 1 to 256 tools"),
    ({"tools": [{"name": "a", "kind": "saga"}]},
     "spec.tools[0].compensate is required for kind saga (how is a undone?)"),
    ({"tools": [{"name": "a", "kind": "read", "compensate": {"tool": "b"}}]},
     "spec.tools[0].compensate is only for kind saga (read tools are never undone)"),
    ({"tools": [{"name": "a", "kind": "write"}]},
     "spec.tools[0].kind must be one of read, saga, deferred, got 'write'"),
    ({"tools": [{"name": "a", "kind": "read"}, {"name": "a", "kind": "read"}]},
     "spec.tools lists a more than once"),
    ({"upstream": {"url": "ftp://x/mcp"}},
     "spec.upstream.url must be an absolute http:// or https:// URL, got 'ftp://x/mcp'"),
    ({"upstream": {"url": "http://u:p@x/mcp"}}, "spec.upstream.url must not carry credentials"),
    ({"upstream": {"url": "http://x/mcp", "timeoutSeconds": 0}},
     "spec.upstream.timeoutSeconds must be a number of seconds between 1 and 300, got 0"),
    ({"upstream": {"url": "http://x/mcp", "headers": [{"name": "Host", "file": "/f"}]}},
     "spec.upstream.headers[0].name 'Host' is set by AgentTx"),
    ({"upstream": {"url": "http://x/mcp", "headers": [{"name": "A", "value": "secret"}]}},
     "spec.upstream.headers[0].value is not allowed here"),
    ({"upstream": {"url": "http://x/mcp",
                   "headers": [{"name": "A", "secretKeyRef": {"name": "s", "key": "k"}}]}},
     "spec.upstream.headers[0].secretKeyRef needs Kubernetes"),
    ({"extra": 1}, "spec: unknown field(s) extra"),
])
def test_an_invalid_spec_is_refused_naming_the_field(change, message):
    with pytest.raises(ToolsetError) as err:
        from_spec("ns", "n", 0, {**SPEC, **change})
    assert message in str(err.value)


def test_secret_key_refs_become_projected_files_and_literal_values_are_never_published():
    spec = {**SPEC, "upstream": {"url": "http://x/mcp", "headers": [
        {"name": "Authorization", "secretKeyRef": {"name": "tok", "key": "header"}}]}}
    t = from_spec("ns", "n", 1, spec, secret_path=lambda s, k: f"/etc/agenttx/toolsets/{s}/{k}")
    assert t.upstream.headers[0].file == "/etc/agenttx/toolsets/tok/header"
    literal = parse_file({"toolsets": [{"name": "n", "spec": {
        **SPEC, "upstream": {"url": "http://x/mcp",
                             "headers": [{"name": "X-Test", "value": "s3cret"}]}}}]})[0]
    assert literal.namespace == "default" and literal.upstream.headers[0].value == "s3cret"
    assert "s3cret" not in repr(literal)
    with pytest.raises(ToolsetError, match="never published"):
        to_json(literal)


def test_a_toolsets_file_names_the_bad_entry():
    with pytest.raises(ToolsetError) as err:
        parse_file({"toolsets": [{"name": "ok", "spec": SPEC},
                                 {"name": "bad", "spec": {**SPEC, "prefix": ""}}]})
    assert str(err.value).startswith("toolsets[1] ('bad'): spec.prefix must be a non-empty")
    with pytest.raises(ToolsetError, match="default/ok declared more than once"):
        parse_file({"toolsets": [{"name": "ok", "spec": SPEC}, {"name": "ok", "spec": SPEC}]})


def test_compensation_arguments_keep_json_types_and_interpolate_text():
    args = {"id": "${output.id}", "note": "undo ${arguments.title} (${output.id})",
            "tags": "${arguments.tags}", "first": "${arguments.tags.0}", "fixed": 1}
    got = resolve_compensation(args, call_arguments={"title": "T", "tags": ["a", "b"]},
                               output={"id": 7})
    assert got == {"id": 7, "note": "undo T (7)", "tags": ["a", "b"], "first": "a", "fixed": 1}
    with pytest.raises(KeyError, match=r"\$\{output.missing\}"):
        resolve_compensation({"x": "${output.missing}"}, call_arguments={}, output={})


def test_published_bytes_are_stable():
    t = from_spec("ns", "n", 2, SPEC)
    assert to_json(t) == to_json(parse_published(to_json(t)))
    assert json.loads(to_json(t))["spec"]["tools"][1] == {"name": "send_email", "kind": "deferred"}


# ---- header files ------------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "value"), [
    (b"Bearer abc", "Bearer abc"),
    (b"Bearer abc\n", "Bearer abc"),           # what `echo` and editors leave
    (b"Bearer abc\r\n", "Bearer abc"),
    (b"Bearer abc\n\n", "Bearer abc"),         # every trailing line break is dropped
    (b"a\tb", "a\tb"),                         # tab is a valid field character
    (b"Bearer a\nb", None),                    # a line break inside: header injection
    (b"x\x00y", None),
    (b"\n", None),                             # empty
    (b"  ", None),
    (b"\xff\xfe", None),                       # not UTF-8
])
def test_header_value_is_read_like_an_http_field_value(raw, value):
    if value is not None:
        assert header_value(raw) == value
        return
    with pytest.raises(ToolsetError) as exc:
        header_value(raw, "key 'h' of Secret ns/s")
    assert str(exc.value).startswith("key 'h' of Secret ns/s ")
    assert "abc" not in str(exc.value) and "Bearer" not in str(exc.value)
