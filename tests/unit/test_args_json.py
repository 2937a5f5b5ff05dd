"""`agenttx.args.jsonargs`: arguments_json parsed the way serde_json would, with its messages,
in linear time for any input (SPEC §3, issue 9 item 1).

Every input the engine's parser handled is here with its exact message (the malformed
documents of tests/integration/test_bad_input.py), plus what the old parser got wrong:
repeated keys, numbers an f64 cannot hold, trailing commas, the order of errors, and 1 MiB
hostile documents that took it seconds to minutes (the `timeout` marks are hang guards,
not performance assertions; figures are in docs/benchmarks.md). Pure: no I/O.
"""

from __future__ import annotations

import ast
import json
import pathlib
import random
import re

import pytest

import agenttx.args
from agenttx.args import MAX_DEPTH, ArgumentsError, describe, dumps, json_depth, parse_arguments
from agenttx.cleaner import clean_error

MIB = 1024 * 1024
DEPTH = 10_000


def error(text: str) -> str:
    with pytest.raises(ArgumentsError) as info:
        parse_arguments(text)
    return str(info.value)


# (id, arguments_json, the exact message)
MALFORMED: list[tuple[str, str, str]] = [
    ("truncated", '{"key": "k", "value": ', "EOF while parsing a value at line 1 column 22"),
    ("unterminated-string", '{"key": "k', "EOF while parsing a string at line 1 column 10"),
    ("single-quotes", "{'key': 'k'}", "key must be a string at line 1 column 2"),
    ("trailing-garbage", '{"key": "k"}}', "trailing characters at line 1 column 13"),
    ("bare-word", "hello", "expected value at line 1 column 1"),
    ("nan", '{"key": "k", "value": NaN}', "expected value at line 1 column 23"),
    ("infinity", '{"key": "k", "value": -Infinity}', "expected value at line 1 column 23"),
    ("number-out-of-range", '{"key": "k", "value": 1e400}',
     "number out of range at line 1 column 27"),
    ("huge-integer", '{"key": "k", "value": ' + "9" * 5000 + "}",
     "number out of range at line 1 column 5022"),
    ("bad-escape", '{"key": "\\x41"}', "invalid escape at line 1 column 10"),
    ("bad-unicode-escape", '{"key": "\\u12G4"}', "invalid escape at line 1 column 11"),
    ("raw-control-char", '{"key": "a\tb"}',
     "control character (\\u0000-\\u001F) found while parsing a string at line 1 column 11"),
    ("raw-nul", '{"key": "a\x00b"}',
     "control character (\\u0000-\\u001F) found while parsing a string at line 1 column 11"),
    ("comment", '{"key": "k" /* c */}', "expected `,` or `}` at line 1 column 13"),
    ("bom", '\ufeff{"key": "k"}', "expected value at line 1 column 1"),
    ("missing-colon", '{"key" "k"}', "expected `:` at line 1 column 8"),
    ("missing-comma-in-list", '{"key": [1 2]}', "expected `,` or `]` at line 1 column 12"),
    ("eof-in-list", '{"key": [1, 2', "EOF while parsing a list at line 1 column 13"),
    ("eof-in-object", '{"key": 1', "EOF while parsing an object at line 1 column 9"),
    ("eof-after-key", '{"key"', "EOF while parsing an object at line 1 column 6"),
    ("empty-key-position", '{"key": 1, }', "trailing comma at line 1 column 12"),
    ("trailing-comma-list", '{"key": [1,]}', "trailing comma at line 1 column 12"),
    ("second-line", '{"key": 1,\n  "value": }', "expected value at line 2 column 12"),
    ("deep-arrays", '{"key": "k", "value": ' + "[" * DEPTH + "]" * DEPTH + "}",
     "recursion limit exceeded at line 1 column 150"),
    ("deep-objects", '{"key": "k", "value": ' + '{"a":' * DEPTH + "1" + "}" * DEPTH + "}",
     "recursion limit exceeded at line 1 column 658"),
    ("deep-unbalanced", "[" * DEPTH, "recursion limit exceeded at line 1 column 129"),
    ("lone-high-surrogate", '{"key": "\\ud800"}',
     "lone leading surrogate in hex escape at line 1 column 15"),
    ("lone-low-surrogate", '{"key": "a\\udc00b"}', "invalid unicode code point at line 1 column 16"),
    ("reversed-pair", '{"key": "\\udc00\\ud800"}', "invalid unicode code point at line 1 column 15"),
    ("surrogate-in-key", '{"\\ud800": "k"}', "lone leading surrogate in hex escape at line 1 column 8"),
    ("surrogate-in-path", '{"path": "f\\ud83d.txt", "contents": "x"}',
     "lone leading surrogate in hex escape at line 1 column 17"),
    ("low-surrogate-after-hex-letters", '{"key": "k", "value": "ab\\udc00"}',
     "invalid unicode code point at line 1 column 31"),
    ("high-then-high", '{"key": "\\ud800\\ud800\\udc00"}',
     "lone leading surrogate in hex escape at line 1 column 15"),
    ("high-then-escaped-backslash", '{"x": "\\ud800\\\\udc00"}',
     "lone leading surrogate in hex escape at line 1 column 13"),
    ("escaped-backslash-then-low", '{"x": "\\\\ud800\\udc00"}',
     "invalid unicode code point at line 1 column 20"),
    ("odd-backslashes-then-high", '{"x": "\\\\\\ud800"}',
     "lone leading surrogate in hex escape at line 1 column 15"),
]


@pytest.mark.parametrize(("text", "message"), [c[1:] for c in MALFORMED],
                         ids=[c[0] for c in MALFORMED])
def test_malformed_arguments_fail_with_serdes_message(text: str, message: str) -> None:
    assert error(text) == message


# (id, arguments_json, the parsed value)
VALID: list[tuple[str, str, object]] = [
    ("deep-in-a-string", json.dumps({"key": "k", "value": "[" * DEPTH}),
     {"key": "k", "value": "[" * DEPTH}),
    ("escaped-backslash-then-u", '{"key": "\\\\ud800-x"}', {"key": "\\ud800-x"}),
    ("valid-pair", '{"key": "\\ud83d\\ude00", "value": "\\uD83D\\uDE00"}',
     {"key": "\U0001f600", "value": "\U0001f600"}),
    ("nul-escaped", '{"key": "a\\u0000b", "ke\\u0000y": 1}', {"key": "a\x00b", "ke\x00y": 1}),
    ("unicode-line-separator", '{"key": "a\u2028b"}', {"key": "a\u2028b"}),
    ("empty-document", "", {}),
    ("whitespace-only", " \n\t ", {}),
    ("nan-in-a-string", '{"a": "NaN", "b": "1e400", "c": "-Infinity"}',
     {"a": "NaN", "b": "1e400", "c": "-Infinity"}),
    ("same-key-in-different-objects", '{"a": {"x": 1}, "b": {"x": 2}, "c": [{"x": 3}, {"x": 4}]}',
     {"a": {"x": 1}, "b": {"x": 2}, "c": [{"x": 3}, {"x": 4}]}),
    ("key-equal-to-a-value", '{"a": "b", "b": "a"}', {"a": "b", "b": "a"}),
    ("big-but-finite-float", '{"v": 1.7976931348623157e308, "w": 1e-400}',
     {"v": 1.7976931348623157e308, "w": 0.0}),
    ("big-integer-kept-exact", '{"v": ' + "9" * 308 + "}", {"v": int("9" * 308)}),
    ("309-digit-integer-that-fits", '{"v": ' + "1" * 309 + "}", {"v": int("1" * 309)}),
    ("exponent-that-fits", '{"v": 1' + "0" * 200 + "e99}", {"v": 1e299}),
]


@pytest.mark.parametrize(("text", "value"), [c[1:] for c in VALID], ids=[c[0] for c in VALID])
def test_valid_arguments_parse_to_their_value(text: str, value: object) -> None:
    assert parse_arguments(text) == value


@pytest.mark.parametrize(("text", "message"), [
    ('["key", "k"]', "invalid type: sequence, expected a map"),
    ("42", "invalid type: integer `42`, expected a map"),
    ("4.5", "invalid type: floating point `4.5`, expected a map"),
    ('"key"', 'invalid type: string "key", expected a map'),
    ("null", "invalid type: null, expected a map"),
    ("true", "invalid type: boolean `true`, expected a map"),
])
def test_a_document_that_is_not_an_object_is_the_wrong_type(text: str, message: str) -> None:
    assert error(text) == message


def test_nesting_128_levels_is_accepted_and_129_is_refused() -> None:
    inner = "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)
    assert parse_arguments('{"v": ' + inner + "}")["v"] == json.loads(inner)
    assert error('{"v": [' + inner + "]}") == "recursion limit exceeded at line 1 column 134"
    # brackets inside strings are text, and a too-deep group is caught after shallow ones
    assert parse_arguments('{"v": "' + "[" * 500 + '", "w": ' + inner + "}")["w"] == json.loads(inner)
    assert error('{"a": [[]], "v": [' + inner + "]}") == "recursion limit exceeded at line 1 column 145"


# ---- repeated keys ------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "message"), [
    ('{"key": "a", "key": "b"}', "duplicate field `key` at line 1 column 18"),
    ('{"a": 1,\n "b": 2,\n "a": 3}', "duplicate field `a` at line 3 column 4"),
    ('{"a": 1, "b": [1, {"c": 2, "c": 3}]}', "duplicate field `c` at line 1 column 30"),
    ('{"a": 1, "\\u0061": 2}', "duplicate field `a` at line 1 column 17"),
    # the first in the document wins, wherever the decoder noticed it
    ('{"a": {"b": 1, "b": 2}, "a": 3}', "duplicate field `b` at line 1 column 18"),
    ('{"a": 1, "a": {"b": 1, "b": 2}}', "duplicate field `a` at line 1 column 12"),
    ('[{"x": 1}, {"y": 1, "y": 2}, {"z": 1, "z": 2}]', "duplicate field `y` at line 1 column 23"),
    # serde stops at the repeated key, before its colon and value
    ('{"a": 1, "a"', "duplicate field `a` at line 1 column 12"),
    ('{"a": 1, "a": 1e400}', "duplicate field `a` at line 1 column 12"),
    ('{"a": 1, "a": 2, "b": ', "duplicate field `a` at line 1 column 12"),
    ('{"a": [1, 2, {"k": 1, "k": [[', "duplicate field `k` at line 1 column 25"),
    # a key that could break the message's one line is escaped
    ('{"a\\nb": 1, "a\\nb": 2}', "duplicate field `a\\nb` at line 1 column 18"),
])
def test_a_repeated_key_is_a_duplicate_field(text: str, message: str) -> None:
    assert error(text) == message


def test_errors_before_a_repeated_key_win() -> None:
    assert error('{"a": 1 "a": 2}') == "expected `,` or `}` at line 1 column 9"
    assert error('{"a": 1e400, "a": 2}') == "number out of range at line 1 column 11"
    assert error('{"a": "\\ud800", "a": 2}') == "lone leading surrogate in hex escape at line 1 column 13"


# ---- serde's order and positions -----------------------------------------------------------

@pytest.mark.parametrize(("text", "message"), [
    # the example: 1e400 inside the string is text, the one after it is the number
    ('{"a":"' + "1e400 " * 3000 + '","b":1e400}', "number out of range at line 1 column 18017"),
    # errors inside the document come before its type (as before)
    ('["1e400", 1e400]', "number out of range at line 1 column 15"),
    ('{"v": ["1e400", 1e400]}', "number out of range at line 1 column 21"),
    ('{"v": [1, 2.5, -3' + "0" * 400 + "]}", "number out of range at line 1 column 417"),
    ('{"v": 1' + "0" * 300 + "e99}", "number out of range at line 1 column 310"),
    ('{"v": -' + "9" * 309 + "}", "number out of range at line 1 column 316"),
    ('{"a": "NaN", "b": NaN}', "expected value at line 1 column 19"),
    ('{"a": "\\ud800", "b": }', "lone leading surrogate in hex escape at line 1 column 13"),
    ('{"a": , "b": "\\ud800"}', "expected value at line 1 column 7"),
    # Python's decoder stops at an escape that ends the text (the old parser said the same)
    ('{"a": "\\ud800', "invalid escape at line 1 column 9"),
    ('{"a": "\\ud800x', "lone leading surrogate in hex escape at line 1 column 13"),
    ('{"a": "\\"\\"\\"', "EOF while parsing a string at line 1 column 13"),
    ('{"a": 1 [' + "[" * 200, "expected `,` or `}` at line 1 column 9"),
    ('{"a": [1 2' + "[" * 200, "expected `,` or `]` at line 1 column 10"),
    ('{"a": x' + "[" * 200, "expected value at line 1 column 7"),
    ("{\n" + '"a": ' + "[" * 200, "recursion limit exceeded at line 2 column 133"),
])
def test_the_first_error_in_the_document_is_reported(text: str, message: str) -> None:
    assert error(text) == message


def test_columns_count_characters_on_the_line() -> None:
    assert error('{"é€😀": 1,\n "b": nope}') == "expected value at line 2 column 7"


# ---- the cleaner knows every message -------------------------------------------------------

@pytest.mark.parametrize(("text", "category"), [
    ('{"key": "k"', "invalid_text_representation"),
    ('{"a": 1,}', "invalid_text_representation"),
    ('{"a": 1e400}', "invalid_text_representation"),
    ('{"a": ' + "[" * 200, "invalid_text_representation"),
    ('{"a": "\\udc00"}', "invalid_text_representation"),
    ('{"a": "\\ud800"}', "invalid_text_representation"),
    ('{"a": 1, "a": 2}', "invalid_parameter_value"),
    ('{"a\\nb": 1, "a\\nb": 2}', "invalid_parameter_value"),
    ("[1]", "invalid_parameter_value"),
])
def test_every_message_is_classified_by_the_cleaner(text: str, category: str) -> None:
    cleaned = clean_error(error(text))
    assert cleaned.category == category, cleaned


def test_a_duplicate_field_hint_names_the_key_and_position() -> None:
    cleaned = clean_error(error('{"key": "a", "key": "b"}'))
    assert cleaned.hint == 'Argument "key" is given more than once; send it once.'
    assert dict(cleaned.subject) == {"field": "key", "line": "1", "column_no": "18"}


# ---- 1 MiB hostile documents (hang guards: the old parser took seconds to minutes) ---------

def fill(unit: str, head: str = "", tail: str = "", size: int = MIB) -> str:
    return head + unit * ((size - len(head) - len(tail)) // len(unit)) + tail


DEEP_126 = "[" * 126 + "]" * 126

HOSTILE: list[tuple[str, str, str | None]] = [
    ("nesting-at-the-limit", fill(DEEP_126 + ",", '{"v":[', DEEP_126 + "]}"), None),
    ("129th-level-at-the-end", fill(DEEP_126 + ",", '{"v":[', "[" + DEEP_126 + "]]}"),
     "recursion limit exceeded at line 1 column 1048312"),
    ("unclosed-brackets", fill("["), "recursion limit exceeded at line 1 column 129"),
    ("1e400-in-a-string-then-a-number", fill("1e400 ", '{"a":"', '","b":1e400}'),
     "number out of range at line 1 column 1048571"),
    ("1e400-strings-then-a-number", fill('"1e400",', '{"v":[', "1e400]}"),
     "number out of range at line 1 column 1048571"),
    ("1e400-runs", fill("1e400,", '{"v":[', "1]}"), "number out of range at line 1 column 11"),
    ("huge-integer", fill("9", '{"v":', "}"), "number out of range at line 1 column 1048575"),
    ("escaped-quotes-unterminated", fill('\\"', '{"a":"'),
     "EOF while parsing a string at line 1 column 1048576"),
    ("escaped-quotes", fill('\\"', '{"a":"', '"}'), None),
    ("surrogate-pairs-then-a-lone-one", fill("\\ud83d\\ude00", '{"a":"', '\\ud800"}'),
     "lone leading surrogate in hex escape at line 1 column 1048572"),
    ("escaped-backslash-u-text", fill("\\\\ud800", '{"a":"', '"}'), None),
    ("duplicate-key-first", fill('"a":0,', "{", '"a":0}'), "duplicate field `a` at line 1 column 10"),
    ("small-objects-duplicate-in-the-last", fill('{"a":0},', '{"v":[', '{"a":0,"a":1}]}'),
     "duplicate field `a` at line 1 column 1048568"),
    ("small-objects-syntax-error-at-the-end", fill('{"a":0},', '{"v":[', '{"a":0 "b"]}'),
     "expected `,` or `}` at line 1 column 1048566"),
    ("unterminated-references", json.dumps({"v": fill("${steps.1.a", size=MIB - 20)}), None),
    ("stray-closers", fill("]", "{}" * 129), "trailing characters at line 1 column 3"),
    ("127-open-levels-then-an-error", fill('"k",', '{"a":' + "[" * 127, "x"),
     f"expected value at line 1 column {MIB - (MIB - 133) % 4}"),
    ("122-open-objects-then-a-repeat", fill('"k":0,', '{"a":' + '{"b":' * 120 + "{", "x"),
     "duplicate field `k` at line 1 column 615"),
    ("208-digit-runs", fill("9" * 208 + ",", '{"v":[', "1]}"), None),
    ("flat-object", json.dumps({f"k{i}": i for i in range(100_000)}), None),
]


@pytest.mark.timeout(20, method="thread")
@pytest.mark.parametrize(("text", "message"), [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_a_hostile_mebibyte_parses_or_fails_cleanly(text: str, message: str | None) -> None:
    if message is None:
        assert parse_arguments(text) == json.loads(text)
    else:
        assert error(text) == message


# The search for numbers an f64 cannot hold reads a large document in slices of
# jsonargs._SLICE characters (so that no regex call holds the GIL long): a number cut by a
# slice boundary must still be found, whichever of its characters sits on the boundary.
SLICE = agenttx.args.jsonargs._SLICE


@pytest.mark.parametrize("literal", ["1e400", "1E+0400", "1" + "0" * 309])
@pytest.mark.parametrize("shift", [-300, -4, -2, -1, 0, 1])
def test_a_number_out_of_range_across_a_slice_boundary_is_found(literal: str, shift: int) -> None:
    head = '{"pad":"'
    start = SLICE + shift  # where the literal begins
    text = head + "x" * (start - len(head) - len('","n":')) + '","n":' + literal + "}"
    assert text.index(literal) == start
    assert error(text) == f"number out of range at line 1 column {start + len(literal)}"


@pytest.mark.parametrize("literal", ["1e308", "1" + "0" * 208, "1.5e-400"])
def test_numbers_an_f64_holds_across_a_slice_boundary_parse(literal: str) -> None:
    text = '{"pad":"' + "x" * (SLICE - 12) + '","n":' + literal + "}"
    assert parse_arguments(text)["n"] == json.loads(text)["n"]


@pytest.mark.timeout(20, method="thread")
def test_a_repeated_key_after_100k_keys_is_found() -> None:
    text = json.dumps({f"k{i}": i for i in range(100_000)})[:-1] + ', "k0": 1}'
    assert error(text) == f"duplicate field `k0` at line 1 column {len(text) - 4}"


# ---- any input: a value or an ArgumentsError, never anything else -------------------------

ATOMS = ["0", "-1", "1.5", "1e5", "1e400", '"a"', '"\\ud800"', '"\\udc00"', '"\\ud83d\\ude00"',
         '"\\\\"', '"\\""', "true", "null", "NaN", '"[{"', '"${steps.1}"']
KEYS = ['"a"', '"b"', '"\\u0061"']


def random_document(rnd: random.Random, depth: int = 0) -> str:
    roll = rnd.random()
    if depth > 3 or roll < 0.4:
        return rnd.choice(ATOMS)
    if roll < 0.7:
        return "[" + ",".join(random_document(rnd, depth + 1) for _ in range(rnd.randint(0, 3))) + "]"
    keys = [rnd.choice(KEYS) for _ in range(rnd.randint(0, 3))]
    return "{" + ",".join(f"{k}:{random_document(rnd, depth + 1)}" for k in keys) + "}"


def mutated(rnd: random.Random, text: str) -> str:
    for _ in range(rnd.randint(0, 2)):
        i, c = rnd.randint(0, len(text)), rnd.choice(["", "[", "]", "{", "}", ",", ":", '"', "\\", " "])
        text = text[:i] + c + text[i + (rnd.random() < 0.5):]
    return text


def test_random_documents_parse_or_fail_with_a_positioned_message() -> None:
    rnd = random.Random(9)
    for _ in range(3000):
        text = mutated(rnd, '{"k":' + random_document(rnd) + "}")
        try:
            value = parse_arguments(text)
        except ArgumentsError as exc:
            message = str(exc)
            assert re.fullmatch(r"[^\n]+ at line [0-9]+ column [0-9]+|invalid type: .*", message), message
            continue
        # accepted: exactly what Python reads, and storable (finite numbers, valid UTF-8)
        assert value == json.loads(text)
        dumps(value).encode("utf-8")


# ---- helpers kept from the engine's module ------------------------------------------------

@pytest.mark.parametrize(("value", "wording"), [
    (None, "null"), (True, "boolean `true`"), (False, "boolean `false`"), (5, "integer `5`"),
    (1.5, "floating point `1.5`"), ("x\n", 'string "x\\n"'), ("é", 'string "é"'), ([1], "sequence"),
    ({"a": 1}, "map"),
])
def test_describe_uses_serdes_unexpected_wording(value: object, wording: str) -> None:
    assert describe(value) == wording


def test_dumps_is_compact_utf8_and_refuses_nan() -> None:
    assert dumps({"a": [1, "é"], "b": None}) == '{"a":[1,"é"],"b":null}'
    with pytest.raises(ValueError):
        dumps(float("nan"))


@pytest.mark.parametrize(("text", "depth"), [
    ("1", 0), ('"[[["', 0), ("[]", 1), ('{"a": [[], {"b": "]]]]"}]}', 3), ("[[[[1]]], 2]", 4),
])
def test_json_depth_counts_levels_outside_strings(text: str, depth: int) -> None:
    assert json_depth(text) == depth


def test_the_package_imports_nothing_above_it() -> None:
    forbidden = ("agenttx.engine", "agenttx.tools", "agenttx.store", "agenttx.api", "grpc", "aetcd")
    package = pathlib.Path(agenttx.args.__file__).parent
    for source in sorted(package.glob("*.py")):
        tree = ast.parse(source.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            for name in names:
                assert not name.startswith(forbidden), f"{source.name} imports {name}"
