"""Hostile `arguments_json` never yields INTERNAL or UNKNOWN: each document is either a
failed step with a precise category or INVALID_ARGUMENT, and afterwards both replicas
keep serving (a normal transaction commits). Issue 2, "Proven by"."""

from __future__ import annotations

import json

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agenttx.v1 import agenttx_pb2 as pb
from support.rpc import CATEGORIES, TIMEOUT_S, expect_failure
from support.service import Agent

MIB = 1024 * 1024
DEPTH = 10_000

# (id, tool, arguments_json, expected category or None for success)
CASES: list[tuple[str, str, str, str | None]] = [
    # malformed
    ("truncated", "kv.put", '{"key": "k", "value": ', "invalid_text_representation"),
    ("unterminated-string", "kv.put", '{"key": "k', "invalid_text_representation"),
    ("single-quotes", "kv.put", "{'key': 'k'}", "invalid_text_representation"),
    ("trailing-garbage", "kv.put", '{"key": "k"}}', "invalid_text_representation"),
    ("bare-word", "kv.put", "hello", "invalid_text_representation"),
    ("nan", "kv.put", '{"key": "k", "value": NaN}', "invalid_text_representation"),
    ("infinity", "kv.put", '{"key": "k", "value": -Infinity}', "invalid_text_representation"),
    ("number-out-of-range", "kv.put", '{"key": "k", "value": 1e400}',
     "invalid_text_representation"),
    ("huge-integer", "kv.put", '{"key": "k", "value": ' + "9" * 5000 + "}",
     "invalid_text_representation"),
    ("bad-escape", "kv.put", '{"key": "\\x41"}', "invalid_text_representation"),
    ("raw-control-char", "kv.put", '{"key": "a\tb"}', "invalid_text_representation"),
    ("raw-nul", "kv.put", '{"key": "a\x00b"}', "invalid_text_representation"),
    ("comment", "kv.put", '{"key": "k" /* c */}', "invalid_text_representation"),
    ("bom", "kv.put", '\ufeff{"key": "k"}', "invalid_text_representation"),
    # deeply nested
    ("deep-arrays", "kv.put", '{"key": "k", "value": ' + "[" * DEPTH + "]" * DEPTH + "}",
     "invalid_text_representation"),
    ("deep-objects", "kv.put", '{"key": "k", "value": ' + '{"a":' * DEPTH + "1" + "}" * DEPTH
     + "}", "invalid_text_representation"),
    ("deep-unbalanced", "kv.put", "[" * DEPTH, "invalid_text_representation"),
    ("deep-in-a-string", "kv.put", json.dumps({"key": "k", "value": "[" * DEPTH}), None),
    ("nested-128", "kv.put", '{"key": "k", "value": ' + "[" * 127 + "]" * 127 + "}", None),
    # huge
    ("huge-value", "kv.put", '{"key": "k", "value": "' + "x" * (MIB - 40) + '"}', None),
    ("huge-multibyte", "kv.put", '{"key": "k", "value": "' + "€" * (MIB // 3 - 20) + '"}', None),
    ("huge-many-keys", "kv.put", json.dumps({"key": "k", **{f"f{i}": i for i in range(60_000)}}),
     "invalid_parameter_value"),
    ("huge-array", "kv.put", json.dumps({"key": "k", "value": [0] * (MIB // 3)}), None),
    ("huge-file", "fs.write", json.dumps({"path": "huge-<uniq>.txt", "contents": "y" * (MIB - 60)}),
     None),
    ("many-references", "record.insert", json.dumps({
        "table": "t", "id": 1, "fields": {f"f{i}": i for i in range(5000)},
        "references": {f"f{i}": "p" for i in range(5000)}}), "program_limit_exceeded"),
    ("many-references-on-record-get", "record.get", json.dumps({
        "table": "t", "id": 1, "fields": {f"f{i}": i for i in range(5000)},
        "references": {f"f{i}": "p" for i in range(5000)}}), "invalid_parameter_value"),
    # not an object
    ("array", "kv.put", '["key", "k"]', "invalid_parameter_value"),
    ("number", "kv.put", "42", "invalid_parameter_value"),
    ("string", "kv.put", '"key"', "invalid_parameter_value"),
    ("null", "kv.put", "null", "invalid_parameter_value"),
    ("bool", "kv.put", "true", "invalid_parameter_value"),
    # lone surrogates
    ("lone-high-surrogate", "kv.put", '{"key": "\\ud800"}', "invalid_text_representation"),
    ("lone-low-surrogate", "kv.put", '{"key": "a\\udc00b"}', "invalid_text_representation"),
    ("reversed-pair", "kv.put", '{"key": "\\udc00\\ud800"}', "invalid_text_representation"),
    ("surrogate-in-key", "kv.put", '{"\\ud800": "k"}', "invalid_text_representation"),
    ("surrogate-in-path", "fs.write", '{"path": "f\\ud83d.txt", "contents": "x"}',
     "invalid_text_representation"),
    ("low-surrogate-after-hex-letters", "kv.put", '{"key": "k", "value": "ab\\udc00"}',
     "invalid_text_representation"),
    ("high-then-high", "kv.put", '{"key": "\\ud800\\ud800\\udc00"}',
     "invalid_text_representation"),
    ("escaped-backslash-then-u", "kv.put", '{"key": "\\\\ud800-<uniq>"}', None),
    ("valid-pair", "kv.put", '{"key": "\\ud83d\\ude00-<uniq>", "value": "\\ud83d\\ude00"}', None),
    # NUL (escaped) in keys, values and paths
    ("nul-in-kv-key", "kv.put", '{"key": "a\\u0000b-<uniq>", "value": "v"}', None),
    ("nul-in-value", "kv.put", '{"key": "k", "value": "x\\u0000y"}', None),
    ("nul-in-argument-name", "kv.put", '{"key": "k", "ke\\u0000y": 1}', "invalid_parameter_value"),
    ("nul-in-path", "fs.write", '{"path": "a\\u0000b", "contents": "x"}',
     "invalid_parameter_value"),
    ("nul-in-read-path", "fs.read", '{"path": "\\u0000"}', "invalid_parameter_value"),
    ("nul-in-contents", "fs.write", '{"path": "nul-<uniq>.txt", "contents": "a\\u0000b"}', None),
    ("nul-in-table", "record.insert", '{"table": "t\\u0000", "id": 1}', "invalid_name"),
    ("nul-in-record-id", "record.insert", '{"table": "t_<uniq>", "id": "a\\u0000b"}', None),
    ("nul-in-channel", "effect.stage", '{"channel": "log\\u0000"}', "undefined_object"),
    ("nul-in-reference", "kv.put", '{"key": "${steps.1\\u0000.key}"}', None),
    # odd but valid shapes
    ("empty-document", "kv.put", "", "invalid_parameter_value"),
    ("whitespace-only", "kv.put", " \n\t ", "invalid_parameter_value"),
    ("duplicate-keys", "kv.put", '{"key": "a", "key": "b"}', "invalid_parameter_value"),
    ("unicode-line-separator", "kv.put", '{"key": "a\u2028b"}', None),
    ("reference-to-itself", "kv.put", '{"key": "${steps.1.key}"}', "undefined_object"),
    ("reference-bad-step-number", "kv.put", '{"key": "${steps.99999999999999999999.key}"}',
     "undefined_object"),
]


@pytest.mark.parametrize(("tool", "raw", "category"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_hostile_arguments_fail_the_step_cleanly(a, b, uniq, tool, raw, category):
    for i, stub in enumerate((a, b)):
        agent = Agent(stub)
        try:
            resp = agent.step(tool, raw=raw.replace("<uniq>", f"{uniq}_{i}"))
        except grpc.RpcError as err:  # only validation may refuse the call
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details())
            continue
        if category is None:
            assert resp.status == pb.STEP_STATUS_SUCCESS, (resp.error_category, resp.clean_hint)
            assert agent.commit().committed
        else:
            assert category in CATEGORIES
            expect_failure(resp, category)
            assert resp.next_step_id == 1
            assert agent.commit().steps_committed == 0


def test_nul_bytes_round_trip_through_kv_and_files(a, sandbox, uniq):
    agent = Agent(a)
    key = f"nul\x00key-{uniq}"
    assert agent.ok("kv.put", {"key": key, "value": "v\x00al"}) == {"key": key, "value": "v\x00al"}
    assert agent.ok("kv.get", {"key": key})["value"] == "v\x00al"
    assert agent.ok("fs.write", {"path": f"nul-rt-{uniq}.txt", "contents": "a\x00b"})["bytes"] == 3
    assert (sandbox / f"nul-rt-{uniq}.txt").read_bytes() == b"a\x00b"
    assert agent.commit().committed
    assert Agent(a).ok("kv.get", {"key": key})["value"] == "v\x00al"


def test_a_very_long_file_name_fails_cleanly(a, sandbox, uniq):
    agent = Agent(a)
    name = f"{uniq}-" + "n" * 300
    expect_failure(agent.step("fs.write", {"path": name, "contents": "x"}),
                   "invalid_parameter_value")
    assert not any(p.name.startswith(uniq) for p in sandbox.iterdir())


def test_a_file_name_of_255_bytes_can_be_written(a, sandbox, uniq):
    agent = Agent(a)
    name = f"{uniq}-" + "n" * (255 - len(uniq) - 1)
    assert agent.ok("fs.write", {"path": name, "contents": "x"})["bytes"] == 1
    assert (sandbox / name).read_text() == "x"
    assert agent.commit().committed


def test_the_service_keeps_serving_after_bad_input(replicas, uniq):
    for replica in replicas:
        assert replica.process is not None and replica.process.poll() is None
        health = health_pb2_grpc.HealthStub(replica.channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT_S)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        agent = Agent(replica.stub)
        agent.ok("kv.put", {"key": f"after-{uniq}-{replica.name}", "value": 1})
        agent.ok("record.insert", {"table": f"t_{uniq}", "id": replica.name})
        assert agent.commit().steps_committed == 2
        internal = [r for r in replica.logs() if r.get("msg") == "internal error"]
        assert internal == [], internal[:1]


@pytest.mark.parametrize("body", ["lone-surrogate-as-bytes", "overlong-nul", "invalid-utf8",
                                  "corrupt-wire-format"])
def test_a_request_that_is_not_a_valid_message_is_invalid_argument(a, replicas, uniq, body):
    agent = Agent(a)
    good = pb.ExecuteStepRequest(transaction_id=agent.tx, step_id=1, tool_name="kv.put",
                                 arguments_json='{"key": "AAAA"}').SerializeToString()
    raw = {"lone-surrogate-as-bytes": good.replace(b"AAAA", b"\xed\xa0\x80A"),  # U+D800, CESU
           "overlong-nul": good.replace(b"AAAA", b"\xc0\x80AA"),
           "invalid-utf8": good.replace(b"AAAA", b"\xff\xfeAA"),
           "corrupt-wire-format": b"\xff\xff\xff\xff garbage"}[body]
    call = replicas[0].channel.unary_unary("/agenttx.v1.AgentTxService/ExecuteStep")
    try:
        call(raw, timeout=TIMEOUT_S)
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details())
        assert "ExecuteStepRequest" in err.details()
    else:
        raise AssertionError("a malformed request was accepted")
    assert agent.ok("kv.put", {"key": f"after-{uniq}"}) == {"key": f"after-{uniq}", "value": None}
