"""The error cleaner (SPEC §4): raw message text -> PostgreSQL condition + one-line hint.

Pure: no etcd, no server. Every case is a raw message as a built-in tool, the engine or a
custom tool would produce it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agenttx.cleaner import CATEGORIES, EMPTY_MESSAGE_HINT, HINT_MAX_CHARS, clean_error

BUILTIN_TOOLS = ("kv.put", "kv.get", "kv.delete", "record.insert", "record.get", "fs.write",
                 "fs.read", "effect.stage")

FK = 'insert or update on table "orders" violates foreign key constraint "orders_customer_id_fkey"'
DUP = 'duplicate key value violates unique constraint "orders_pkey"'
NOT_NULL = 'null value in column "customer_id" of relation "orders" violates not-null constraint'

# (raw message, category, exact subject, fragments the hint must contain)
CASES = [
    # --- no_data_found ------------------------------------------------------------------
    pytest.param('no row with key=cart in table "kv"', "no_data_found",
                 {"key": "cart", "table": "kv"}, ['"cart"', "kv.put"], id="kv-get-missing"),
    pytest.param('no row with id=42 in table "orders"', "no_data_found",
                 {"id": "42", "table": "orders"}, ['"42"', '"orders"'], id="record-get-number-id"),
    pytest.param('no row with id=abc in table "orders"', "no_data_found",
                 {"id": "abc", "table": "orders"}, ['"abc"', '"orders"'], id="record-get-text-id"),
    pytest.param('no row with id=a "b" (c) in table "orders"', "no_data_found",
                 {"id": 'a "b" (c)', "table": "orders"}, [r'"a \"b\" (c)"'],
                 id="record-get-id-with-quotes-and-parens"),
    pytest.param('no row with key=ключ 🔑 in table "kv"', "no_data_found",
                 {"key": "ключ 🔑", "table": "kv"}, ['"ключ 🔑"'], id="kv-get-unicode-key"),
    pytest.param('no row with key=a in table "b" in table "kv"', "no_data_found",
                 {"key": 'a in table "b"', "table": "kv"}, [r'"a in table \"b\""'],
                 id="kv-get-key-that-looks-like-the-suffix"),
    pytest.param("no row with key=two\nlines in table \"kv\"", "no_data_found",
                 {"key": "two\nlines", "table": "kv"}, [r'"two\nlines"'],
                 id="kv-get-key-with-newline"),
    pytest.param("query returned no rows", "no_data_found", {}, ["no rows"],
                 id="postgres-no-rows"),
    # --- unique_violation ---------------------------------------------------------------
    pytest.param(DUP + "\nDETAIL:  Key (id)=(42) already exists.", "unique_violation",
                 {"table": "orders", "column": "id", "id": "42", "value": "42"},
                 ['"42"', '"orders"'], id="duplicate-number-id"),
    pytest.param(DUP + "\nDETAIL:  Key (id)=(abc) already exists.", "unique_violation",
                 {"table": "orders", "column": "id", "id": "abc", "value": "abc"},
                 ['"abc"', '"orders"'], id="duplicate-text-id"),
    pytest.param(DUP + "\nDETAIL: Key (id)=(x) already exists.", "unique_violation",
                 {"table": "orders", "column": "id", "id": "x", "value": "x"}, ['"x"'],
                 id="duplicate-detail-one-space"),
    pytest.param(DUP + "\n   DETAIL:      Key (id)=(x) already exists.", "unique_violation",
                 {"table": "orders", "column": "id", "id": "x", "value": "x"}, ['"x"'],
                 id="duplicate-detail-many-spaces"),
    pytest.param(DUP + " DETAIL:  Key (id)=(x) already exists.", "unique_violation",
                 {"table": "orders", "column": "id", "id": "x", "value": "x"}, ['"x"'],
                 id="duplicate-detail-on-the-same-line"),
    pytest.param(DUP + '\nDETAIL:  Key (id)=(a (b) "c" é) already exists.', "unique_violation",
                 {"table": "orders", "column": "id", "id": 'a (b) "c" é',
                  "value": 'a (b) "c" é'}, [r'"a (b) \"c\" é"'],
                 id="duplicate-id-with-parens-quotes-unicode"),
    pytest.param(DUP, "unique_violation", {"table": "orders"}, ['"orders"'],
                 id="duplicate-without-detail"),
    pytest.param('duplicate key value violates unique constraint "users_email_key"\n'
                 "DETAIL:  Key (email)=(a@b.c) already exists.", "unique_violation",
                 {"table": "users", "column": "email", "value": "a@b.c"},
                 ['"a@b.c"', '"email"', '"users"'], id="duplicate-non-primary-key"),
    # --- not_null_violation -------------------------------------------------------------
    pytest.param(NOT_NULL, "not_null_violation", {"column": "customer_id", "table": "orders"},
                 ['"customer_id"', '"orders"'], id="not-null"),
    pytest.param(NOT_NULL + "\nDETAIL:  Failing row contains (7, null).", "not_null_violation",
                 {"column": "customer_id", "table": "orders"}, ['"customer_id"'],
                 id="not-null-with-failing-row"),
    pytest.param('null value in column "x" violates not-null constraint', "not_null_violation",
                 {"column": "x"}, ['"x"'], id="not-null-old-postgres-wording"),
    # --- foreign_key_violation ----------------------------------------------------------
    pytest.param(FK + '\nDETAIL:  Key (customer_id)=(42) is not present in table "customers".',
                 "foreign_key_violation",
                 {"table": "orders", "column": "customer_id", "value": "42",
                  "ref_table": "customers"},
                 ['"customer_id"', '"orders"', '"42"', '"customers"'], id="fk-number-value"),
    pytest.param(FK + '\nDETAIL: Key (customer_id)=(abc) is not present in table "customers".',
                 "foreign_key_violation",
                 {"table": "orders", "column": "customer_id", "value": "abc",
                  "ref_table": "customers"}, ['"abc"'], id="fk-text-value-one-space"),
    pytest.param(FK + '\nDETAIL:  Key (customer_id)=(O\'Brien (Ltd) "x") is not present in '
                 'table "customers".', "foreign_key_violation",
                 {"table": "orders", "column": "customer_id", "value": 'O\'Brien (Ltd) "x"',
                  "ref_table": "customers"}, ['"O\'Brien (Ltd) \\"x\\""'],
                 id="fk-value-with-quotes-and-parens"),
    pytest.param(FK, "foreign_key_violation", {"table": "orders", "column": "customer_id"},
                 ['"customer_id"', '"orders"'], id="fk-without-detail-column-from-constraint"),
    pytest.param('update or delete on table "customers" violates foreign key constraint '
                 '"orders_customer_id_fkey" on table "orders"\nDETAIL:  Key (id)=(1) is still '
                 'referenced from table "orders".', "foreign_key_violation",
                 {"table": "customers", "column": "id", "value": "1", "ref_table": "orders"},
                 ['"customers"', '"orders"'], id="fk-delete-still-referenced"),
    # --- undefined_file -----------------------------------------------------------------
    pytest.param("No such file or directory: 'notes/a.txt'", "undefined_file",
                 {"path": "notes/a.txt"}, ['"notes/a.txt"', "fs.write"], id="fs-read-missing"),
    pytest.param("[Errno 2] No such file or directory: 'notes/a.txt'", "undefined_file",
                 {"path": "notes/a.txt"}, ['"notes/a.txt"'], id="python-enoent"),
    pytest.param("FileNotFoundError: [Errno 2] No such file or directory: \"it's here.txt\"",
                 "undefined_file", {"path": "it's here.txt"}, ['"it\'s here.txt"'],
                 id="python-enoent-path-with-quote"),
    pytest.param("No such file or directory: 'données/é t.txt'", "undefined_file",
                 {"path": "données/é t.txt"}, ['"données/é t.txt"'], id="enoent-unicode-path"),
    pytest.param('could not open file "base/1/2": No such file or directory', "undefined_file",
                 {"path": "base/1/2"}, ['"base/1/2"'], id="postgres-could-not-open"),
    # --- insufficient_privilege ---------------------------------------------------------
    pytest.param('permission denied for path "../etc/passwd": it resolves outside the sandbox',
                 "insufficient_privilege", {"path": "../etc/passwd"},
                 ['"../etc/passwd"', "outside the sandbox"], id="sandbox-escape"),
    pytest.param('permission denied for path "a"b": it resolves outside the sandbox',
                 "insufficient_privilege", {"path": 'a"b'}, [r'"a\"b"'],
                 id="sandbox-escape-path-with-quote"),
    pytest.param("Permission denied: 'locked/file'", "insufficient_privilege",
                 {"path": "locked/file"}, ['"locked/file"'], id="posix-eacces"),
    pytest.param("[Errno 13] Permission denied: 'locked/file'", "insufficient_privilege",
                 {"path": "locked/file"}, ['"locked/file"'], id="python-eacces"),
    pytest.param("permission denied for table secrets", "insufficient_privilege",
                 {"table": "secrets"}, ['"secrets"'], id="postgres-table-privilege"),
    # --- lock_not_available -------------------------------------------------------------
    pytest.param('could not obtain lock on row in relation "fs"\n'
                 "DETAIL:  Path 'notes/a.txt' is locked by another transaction.",
                 "lock_not_available", {"table": "fs", "path": "notes/a.txt"},
                 ['"notes/a.txt"', "wait", "different path"], id="fs-lock-with-path"),
    pytest.param('could not obtain lock on row in relation "fs"', "lock_not_available",
                 {"table": "fs"}, ["wait", "different path"], id="fs-lock-without-detail"),
    pytest.param("deadlock detected", "lock_not_available", {}, ["wait"], id="deadlock"),
    # --- undefined_object ---------------------------------------------------------------
    pytest.param('channel "sms" does not exist; configured channels: log, webhook',
                 "undefined_object", {"channel": "sms"}, ['"sms"', '"log", "webhook"'],
                 id="unknown-channel-with-list"),
    pytest.param('channel "sms" does not exist', "undefined_object", {"channel": "sms"},
                 ['"sms"'], id="unknown-channel-without-list"),
    pytest.param('step "3" does not exist (referenced as ${steps.3.value}); live steps: 1, 2',
                 "undefined_object", {"step": "3"}, ["${steps.3.value}", "1, 2"],
                 id="reference-to-dead-step"),
    pytest.param('step "5" does not exist (referenced as ${steps.5}); live steps: none',
                 "undefined_object", {"step": "5"}, ["${steps.5}", "no step is live"],
                 id="reference-with-no-live-steps"),
    pytest.param('step "7" does not exist', "undefined_object", {"step": "7"}, ["Step 7"],
                 id="dead-step-bare"),
    pytest.param('relation "invoices" does not exist', "undefined_object",
                 {"table": "invoices"}, ['"invoices"'], id="postgres-relation"),
    # --- undefined_column ---------------------------------------------------------------
    pytest.param('column "value.total" does not exist in the output of step 2 '
                 "(referenced as ${steps.2.value.total})", "undefined_column",
                 {"column": "value.total", "step": "2"}, ['"value.total"', "step 2"],
                 id="reference-path-missing"),
    pytest.param('column "x" does not exist', "undefined_column", {"column": "x"}, ['"x"'],
                 id="postgres-column"),
    pytest.param('column "x" of relation "t" does not exist', "undefined_column",
                 {"column": "x", "table": "t"}, ['"x"', '"t"'], id="postgres-column-of-relation"),
    # --- invalid_parameter_value --------------------------------------------------------
    pytest.param("missing field `key`", "invalid_parameter_value", {"field": "key"}, ['"key"'],
                 id="serde-missing-field"),
    pytest.param("invalid type: integer `5`, expected a string", "invalid_parameter_value", {},
                 ["integer 5", "a string"], id="serde-invalid-type-integer"),
    pytest.param("invalid type: floating point `1.5`, expected a string at line 1 column 9",
                 "invalid_parameter_value", {"line": "1", "column_no": "9"},
                 ["floating point 1.5", "a string"], id="serde-invalid-type-float-with-position"),
    pytest.param("invalid type: boolean `true`, expected a string", "invalid_parameter_value",
                 {}, ["boolean true"], id="serde-invalid-type-boolean"),
    pytest.param('invalid type: string "x", expected a map', "invalid_parameter_value", {},
                 ['string "x"', "one JSON object"], id="serde-invalid-type-string-top-level"),
    pytest.param("invalid type: null, expected a string", "invalid_parameter_value", {},
                 ["(null)"], id="serde-invalid-type-null"),
    pytest.param("invalid type: sequence, expected a map", "invalid_parameter_value", {},
                 ["(sequence)", "one JSON object"], id="serde-invalid-type-sequence"),
    pytest.param("invalid type: map, expected a string or number", "invalid_parameter_value", {},
                 ["(map)", "a string or number"], id="serde-invalid-type-map"),
    pytest.param("fields.customer_id: invalid type: map, expected a string or number",
                 "invalid_parameter_value", {"field": "fields.customer_id"},
                 ['"fields.customer_id"', "a string or number"], id="arg-path-prefix"),
    pytest.param("items[0].sku: invalid type: integer `5`, expected a string at line 3 column 2",
                 "invalid_parameter_value", {"field": "items[0].sku", "line": "3",
                                             "column_no": "2"},
                 ['"items[0].sku"'], id="arg-path-prefix-with-index-and-position"),
    pytest.param("fields: missing field `x`", "invalid_parameter_value", {"field": "fields.x"},
                 ['"fields.x"'], id="arg-path-prefix-joins-missing-field"),
    pytest.param("unknown field `x`, expected one of `key`, `value`", "invalid_parameter_value",
                 {"field": "x"}, ['"x"', '"key", "value"'], id="serde-unknown-field"),
    pytest.param("unknown field `x`, there are no fields", "invalid_parameter_value",
                 {"field": "x"}, ['"x"', "remove it"], id="serde-unknown-field-no-fields"),
    pytest.param("unknown field `x`, expected `key` at line 1 column 4",
                 "invalid_parameter_value", {"field": "x", "line": "1", "column_no": "4"},
                 ['"key"'], id="serde-unknown-field-with-position"),
    pytest.param('invalid value: string "", expected a non-empty relative file path',
                 "invalid_parameter_value", {}, ['string ""', "a non-empty relative file path"],
                 id="serde-invalid-value"),
    pytest.param("Is a directory: 'notes'", "invalid_parameter_value", {"path": "notes"},
                 ['"notes"'], id="posix-eisdir"),
    pytest.param("[Errno 21] Is a directory: 'notes'", "invalid_parameter_value",
                 {"path": "notes"}, ['"notes"'], id="python-eisdir"),
    pytest.param("Not a directory: 'a.txt/b'", "invalid_parameter_value", {"path": "a.txt/b"},
                 ['"a.txt/b"'], id="posix-enotdir"),
    pytest.param("1 validation error for KvPut\nkey\n  Field required [type=missing, "
                 "input_value={}, input_type=dict]", "invalid_parameter_value",
                 {"field": "key"}, ['"key"'], id="pydantic-missing"),
    # --- invalid_text_representation ----------------------------------------------------
    pytest.param("expected value at line 1 column 1", "invalid_text_representation",
                 {"line": "1", "column_no": "1"}, ["line 1, column 1"], id="json-expected-value"),
    pytest.param("EOF while parsing an object at line 1 column 10",
                 "invalid_text_representation", {"line": "1", "column_no": "10"},
                 ["line 1, column 10"], id="json-eof-object"),
    pytest.param("EOF while parsing a list at line 2 column 3", "invalid_text_representation",
                 {"line": "2", "column_no": "3"}, ["line 2, column 3"], id="json-eof-list"),
    pytest.param("EOF while parsing a string at line 1 column 5",
                 "invalid_text_representation", {"line": "1", "column_no": "5"}, ["column 5"],
                 id="json-eof-string"),
    pytest.param("EOF while parsing a value at line 1 column 0", "invalid_text_representation",
                 {"line": "1", "column_no": "0"}, ["column 0"], id="json-eof-value"),
    pytest.param("trailing characters at line 1 column 5", "invalid_text_representation",
                 {"line": "1", "column_no": "5"}, ["trailing characters"], id="json-trailing"),
    pytest.param("key must be a string at line 1 column 2", "invalid_text_representation",
                 {"line": "1", "column_no": "2"}, ["key must be a string"], id="json-key"),
    pytest.param("expected `:` at line 1 column 6", "invalid_text_representation",
                 {"line": "1", "column_no": "6"}, ['expected ":"'], id="json-colon"),
    pytest.param("expected `,` or `}` at line 1 column 9", "invalid_text_representation",
                 {"line": "1", "column_no": "9"}, ['expected "," or "}"'], id="json-comma-brace"),
    pytest.param("expected `,` or `]` at line 4 column 1", "invalid_text_representation",
                 {"line": "4", "column_no": "1"}, ['expected "," or "]"'],
                 id="json-comma-bracket"),
    pytest.param("control character (\\u0000-\\u001F) found while parsing a string at line 1 "
                 "column 4", "invalid_text_representation", {"line": "1", "column_no": "4"},
                 ["control character"], id="json-control-character"),
    pytest.param("invalid escape at line 1 column 3", "invalid_text_representation",
                 {"line": "1", "column_no": "3"}, ["invalid escape"], id="json-escape"),
    pytest.param("invalid number at line 1 column 3", "invalid_text_representation",
                 {"line": "1", "column_no": "3"}, ["invalid number"], id="json-number"),
    pytest.param("lone leading surrogate in hex escape at line 1 column 8",
                 "invalid_text_representation", {"line": "1", "column_no": "8"},
                 ["surrogate"], id="json-lone-surrogate"),
    pytest.param("unexpected end of hex escape at line 1 column 7",
                 "invalid_text_representation", {"line": "1", "column_no": "7"},
                 ["hex escape"], id="json-hex-escape"),
    pytest.param("recursion limit exceeded at line 1 column 129",
                 "invalid_text_representation", {"line": "1", "column_no": "129"},
                 ["column 129"], id="json-recursion"),
    pytest.param("invalid unicode code point at line 1 column 9",
                 "invalid_text_representation", {"line": "1", "column_no": "9"},
                 ["code point"], id="json-code-point"),
    pytest.param("Expecting value: line 1 column 1 (char 0)", "invalid_text_representation",
                 {"line": "1", "column_no": "1"}, ["line 1, column 1"], id="python-json"),
    pytest.param('invalid input syntax for type integer: "abc"', "invalid_text_representation",
                 {"value": "abc"}, ['"abc"', "integer"], id="postgres-input-syntax"),
    # --- invalid_name -------------------------------------------------------------------
    pytest.param('invalid name syntax: table "bad-name" must match [A-Za-z0-9_]{1,128}',
                 "invalid_name", {"table": "bad-name"}, ['"bad-name"', "[A-Za-z0-9_]{1,128}"],
                 id="bad-table-name"),
    pytest.param('invalid name syntax: table "a b\\"c" must match [A-Za-z0-9_]{1,128}',
                 "invalid_name", {"table": 'a b\\"c'}, ["a b"], id="bad-table-name-with-quote"),
    pytest.param('invalid name syntax: table "" must match [A-Za-z0-9_]{1,128}',
                 "invalid_name", {"table": ""}, ['""'], id="empty-table-name"),
    # --- undefined_function -------------------------------------------------------------
    pytest.param("function kv.gett() does not exist", "undefined_function", {"tool": "kv.gett"},
                 ['"kv.gett"', 'did you mean "kv.get"?'], id="unknown-tool-typo"),
    pytest.param("function recordinsert() does not exist", "undefined_function",
                 {"tool": "recordinsert"}, ['did you mean "record.insert"?'],
                 id="unknown-tool-missing-dot"),
    # --- program_limit_exceeded ---------------------------------------------------------
    pytest.param("program limit exceeded: the transaction would write 121 keys; the limit is "
                 "120", "program_limit_exceeded", {}, ["121 keys", "120"],
                 id="write-set-limit"),
    pytest.param("etcdserver: too many operations in txn request", "program_limit_exceeded", {},
                 ["too many operations"], id="etcd-too-many-operations"),
    # --- internal_error -----------------------------------------------------------------
    pytest.param("KeyError: 'boom'\n  more detail", "internal_error", {}, ["KeyError: 'boom'"],
                 id="unrecognised"),
    pytest.param("ValueError: too many values to unpack (expected 2)", "internal_error", {},
                 ["too many values"], id="tool-bug-is-not-a-limit"),
]


@pytest.mark.parametrize(("raw", "category", "subject", "fragments"), CASES)
def test_message_is_classified_with_subject_and_concrete_hint(
        raw: str, category: str, subject: dict[str, str], fragments: list[str]) -> None:
    cleaned = clean_error(raw, known_tools=BUILTIN_TOOLS)
    assert cleaned.category == category
    assert dict(cleaned.subject) == subject
    for fragment in fragments:
        assert fragment in cleaned.hint
    assert_hint_shape(cleaned.hint)


def assert_hint_shape(hint: str) -> None:
    assert hint
    assert len(hint) <= HINT_MAX_CHARS
    assert len(hint.splitlines()) == 1
    assert hint == hint.strip()


# Only a tool that knows the category states these (toolsets); no text is classified so.
STATED_ONLY = frozenset({"fdw_error", "fdw_unable_to_establish_connection"})


def test_cases_cover_every_category() -> None:
    assert {p.values[1] for p in CASES} == CATEGORIES - STATED_ONLY


@pytest.mark.parametrize("category", sorted(STATED_ONLY))
def test_a_stated_category_is_kept_and_the_message_only_made_one_line(category: str) -> None:
    raw = "Error executing tool create_ticket: project OPS is archived\n   ask an admin\r\n"
    cleaned = clean_error(raw, category=category)
    assert (cleaned.category, cleaned.hint, dict(cleaned.subject)) == (
        category, "Error executing tool create_ticket: project OPS is archived ask an admin",
        {})


def test_a_stated_category_keeps_a_long_message_within_the_hint_limit() -> None:
    cleaned = clean_error("upstream says: " + "x" * 500 + "\u2028tail", category="fdw_error")
    assert cleaned.hint.startswith("upstream says: xxx") and cleaned.hint.endswith("…")
    assert_hint_shape(cleaned.hint)


def test_a_stated_category_does_not_stop_an_empty_message_from_getting_a_hint() -> None:
    assert clean_error("  \n ", category="fdw_error") == \
        clean_error("", category="fdw_error")
    assert clean_error("", category="fdw_error").hint == EMPTY_MESSAGE_HINT


def test_an_unknown_or_internal_stated_category_leaves_the_text_to_the_classifier() -> None:
    raw = 'duplicate key value violates unique constraint "t_pkey"'
    for category in ("bogus", "internal_error", None):
        assert clean_error(raw, category=category).category == "unique_violation"


# Full hints, so that a wording change is a deliberate one.
EXACT = [
    ('no row with key=cart in table "kv"',
     'Key "cart" does not exist in kv; kv.put it first or read an existing key.'),
    ('no row with id=42 in table "orders"',
     'No row with id "42" in table "orders"; record.insert it first or use an existing id.'),
    (DUP + "\nDETAIL:  Key (id)=(42) already exists.",
     'Id "42" already exists in table "orders"; use a new id, or record.get the existing row '
     "instead."),
    (NOT_NULL,
     'Field "customer_id" of table "orders" must not be null; set it to a non-null value.'),
    (FK + '\nDETAIL:  Key (customer_id)=(42) is not present in table "customers".',
     'Field "customer_id" of table "orders" references "42", which is not in table '
     '"customers"; insert that row first or use an existing id.'),
    ("No such file or directory: 'notes/a.txt'",
     'File "notes/a.txt" does not exist; fs.write it first or read an existing path.'),
    ('permission denied for path "../x": it resolves outside the sandbox',
     'Path "../x" resolves outside the sandbox; use a relative path inside it (no "..", no '
     "absolute path, no symlink out)."),
    ('could not obtain lock on row in relation "fs"\n'
     "DETAIL:  Path 'a.txt' is locked by another transaction.",
     'Path "a.txt" is locked by another transaction; wait for it to commit or roll back, or '
     "write a different path."),
    ('channel "sms" does not exist; configured channels: log, webhook',
     'Effect channel "sms" does not exist; use one of the configured channels: "log", '
     '"webhook".'),
    ('step "3" does not exist (referenced as ${steps.3.value}); live steps: 1, 2',
     "${steps.3.value} refers to step 3, which is not live; reference one of the live steps: "
     "1, 2."),
    ('column "value.total" does not exist in the output of step 2 '
     "(referenced as ${steps.2.value.total})",
     'Path "value.total" does not exist in the output of step 2; reference a field that step 2 '
     "returned."),
    ("missing field `key`", 'Argument "key" is missing; add it to arguments_json.'),
    ("fields.customer_id: invalid type: floating point `1.5`, expected a string or number",
     'Argument "fields.customer_id" has the wrong type (floating point 1.5); send a string or '
     "number instead."),
    ("unknown field `x`, expected one of `key`, `value`",
     'Argument "x" is not accepted; use only "key", "value".'),
    ("expected value at line 1 column 1",
     "arguments_json is not valid JSON (expected value at line 1, column 1); send exactly one "
     "JSON object."),
    ('invalid name syntax: table "bad-name" must match [A-Za-z0-9_]{1,128}',
     'Table name "bad-name" is invalid; rename it to match [A-Za-z0-9_]{1,128}.'),
    ("function kv.gett() does not exist",
     'Tool "kv.gett" does not exist; did you mean "kv.get"? Use one of the registered tools.'),
    ("program limit exceeded: the transaction would write 121 keys; the limit is 120",
     "Limit exceeded: the transaction would write 121 keys; the limit is 120; make this step "
     "smaller, or commit and continue in a new transaction."),
    ("  RuntimeError:   backend   exploded  \nTraceback ...", "RuntimeError: backend exploded"),
]


@pytest.mark.parametrize(("raw", "hint"), EXACT)
def test_representative_hints_are_worded_exactly(raw: str, hint: str) -> None:
    assert clean_error(raw, known_tools=BUILTIN_TOOLS).hint == hint


# --- the cleaner is a classifier over text, not a side channel -------------------------

class AcmeError(Exception):
    """What a third-party tool might raise."""


@pytest.mark.parametrize("raw", [p.values[0] for p in CASES])
def test_custom_tool_raising_the_same_text_gets_the_same_result(raw: str) -> None:
    builtin = clean_error(raw, known_tools=BUILTIN_TOOLS)
    try:
        raise AcmeError(raw)
    except AcmeError as exc:
        custom = clean_error(str(exc), known_tools=BUILTIN_TOOLS)
    assert custom == builtin


@pytest.mark.parametrize("prefix", [
    "ERROR:  ", "psycopg.errors.UniqueViolation: ", "ValueError: ", "acme.crm: ",
    "tool acme.crm failed: ", "Traceback (most recent call last):\n  File \"x\"\nException: ",
])
def test_wrapped_postgres_message_from_custom_tool_is_cleaned_like_the_builtin(
        prefix: str) -> None:
    raw = DUP + "\nDETAIL:  Key (id)=(42) already exists."
    builtin = clean_error(raw)
    custom = clean_error(prefix + raw, known_tools=("acme.crm",))
    assert custom == builtin


def test_exception_class_and_tool_name_prefixes_are_not_argument_paths() -> None:
    for prefix in ("ValueError: ", "ERROR: ", "error: ", "kv.put: "):
        cleaned = clean_error(prefix + "invalid type: null, expected a string",
                              known_tools=BUILTIN_TOOLS)
        assert cleaned.category == "invalid_parameter_value"
        assert "field" not in cleaned.subject
        assert cleaned.hint.startswith("An argument has the wrong type (null)")


def test_argument_path_is_found_after_other_text() -> None:
    cleaned = clean_error("tool failed: fields.x: invalid type: null, expected a string")
    assert cleaned.subject == {"field": "fields.x"}


def test_user_data_that_looks_like_another_message_does_not_change_the_category() -> None:
    cleaned = clean_error("no row with key=permission denied: 'x' in table \"kv\"")
    assert cleaned.category == "no_data_found"
    assert cleaned.subject == {"key": "permission denied: 'x'", "table": "kv"}


# --- unknown tools ---------------------------------------------------------------------

def test_unknown_tool_suggests_only_the_close_names() -> None:
    cleaned = clean_error("function kv.pu() does not exist", known_tools=BUILTIN_TOOLS)
    assert 'did you mean "kv.put"?' in cleaned.hint
    assert '"kv.get"' not in cleaned.hint


def test_unknown_tool_suggests_several_when_equally_close() -> None:
    cleaned = clean_error("function kv.gt() does not exist",
                          known_tools=("kv.get", "kv.gut", "fs.read"))
    assert 'did you mean "kv.get" or "kv.gut"?' in cleaned.hint


def test_unknown_tool_suggestion_ignores_case_and_iterators_work() -> None:
    cleaned = clean_error("function KV.GET() does not exist", known_tools=iter(BUILTIN_TOOLS))
    assert 'did you mean "kv.get"?' in cleaned.hint


def test_unknown_tool_without_close_match_lists_some_registered_tools() -> None:
    cleaned = clean_error("function zzz() does not exist", known_tools=BUILTIN_TOOLS)
    assert cleaned.hint == ('Tool "zzz" does not exist; use a registered tool, e.g. '
                            '"effect.stage", "fs.read", "fs.write", "kv.delete", "kv.get".')


def test_unknown_tool_without_known_tools() -> None:
    cleaned = clean_error("function kv.gett() does not exist")
    assert cleaned.hint == 'Tool "kv.gett" does not exist; use one of the registered tools.'
    assert cleaned.subject == {"tool": "kv.gett"}


def test_unknown_tool_with_long_names_stays_within_the_limit() -> None:
    tools = ["x" * 128, "y" * 128, "z" * 128]
    cleaned = clean_error("function " + "q" * 300 + "() does not exist", known_tools=tools)
    assert cleaned.subject == {"tool": "q" * 300}
    assert_hint_shape(cleaned.hint)
    assert "…" in cleaned.hint


# --- length, lines, odd input ----------------------------------------------------------

def test_long_value_is_shortened_inside_its_quotes_and_the_instruction_survives() -> None:
    key = "k" * 500
    cleaned = clean_error(f'no row with key={key} in table "kv"')
    assert cleaned.subject == {"key": key, "table": "kv"}  # the subject keeps the full value
    assert len(cleaned.hint) == HINT_MAX_CHARS
    assert cleaned.hint.startswith('Key "kkk')
    assert cleaned.hint.endswith('…" does not exist in kv; kv.put it first or read an existing '
                                 "key.")


def test_several_long_values_are_all_shortened() -> None:
    raw = (f'insert or update on table "{"t" * 120}" violates foreign key constraint '
           f'"{"t" * 120}_f_fkey"\nDETAIL:  Key (f)=({"v" * 300}) is not present in table '
           f'"{"r" * 120}".')
    cleaned = clean_error(raw)
    assert cleaned.category == "foreign_key_violation"
    assert cleaned.subject["value"] == "v" * 300
    assert_hint_shape(cleaned.hint)
    assert cleaned.hint.endswith("; insert that row first or use an existing id.")


def test_internal_error_hint_is_the_first_line_trimmed() -> None:
    cleaned = clean_error("\n\n   " + "word " * 100 + "\nsecond line")
    assert cleaned.category == "internal_error"
    assert cleaned.subject == {}
    assert len(cleaned.hint) == HINT_MAX_CHARS
    assert cleaned.hint.startswith("word word")
    assert cleaned.hint.endswith("…")


@pytest.mark.parametrize("raw", ["", "   ", "\n\n\t \n"])
def test_empty_message_gets_the_generic_hint(raw: str) -> None:
    assert clean_error(raw) == clean_error(raw, known_tools=BUILTIN_TOOLS)
    cleaned = clean_error(raw)
    assert (cleaned.category, cleaned.hint, dict(cleaned.subject)) == (
        "internal_error", EMPTY_MESSAGE_HINT, {})


def weird_inputs() -> Iterator[str]:
    yield "x" * 3_000_000
    yield "no row with key=" * 50_000
    yield 'column "' * 50_000
    yield "line\n" * 10_000
    yield "\u2028\u2029\x85\x0b\x0c\x1c\r\n\t"
    yield "no row with key=a\u2028b\x85c\x0bd in table \"kv\""
    yield 'channel "a\u2029b" does not exist; configured channels: x\u2028y'
    yield "No such file or directory: 'bad\udcffname'"
    yield "\x00\x01\x02 null bytes"
    yield "DETAIL:  Key (id)=(1) already exists."
    yield DUP + "\nDETAIL:  Key ((((((((=(" + ")" * 1000
    yield "invalid type: " + ", expected " * 1000
    yield "{steps.1} {0} {} %s"
    yield "🙂" * 500
    yield "'" * 1000 + '"' * 1000 + "`" * 1000


@pytest.mark.parametrize("raw", list(weird_inputs()),
                         ids=lambda raw: repr(raw[:20]) + f"..{len(raw)}")
def test_any_text_gives_a_single_line_hint_within_the_limit(raw: str) -> None:
    cleaned = clean_error(raw, known_tools=BUILTIN_TOOLS)
    assert cleaned.category in CATEGORIES
    assert_hint_shape(cleaned.hint)
    cleaned.hint.encode("utf-8")  # a valid protobuf string
    for value in cleaned.subject.values():
        value.encode("utf-8")


def test_line_separators_inside_values_are_escaped_not_emitted() -> None:
    cleaned = clean_error('no row with key=a\u2028b in table "kv"')
    assert cleaned.subject["key"] == "a\u2028b"
    assert 'Key "a\\u2028b"' in cleaned.hint


@pytest.mark.parametrize("raw", [None, 42, b"bytes", object()])
def test_non_text_input_never_raises(raw: object) -> None:
    cleaned = clean_error(raw)  # type: ignore[arg-type]
    assert cleaned.category == "internal_error"
    assert_hint_shape(cleaned.hint)


def test_failing_known_tools_iterable_never_raises() -> None:
    def broken() -> Iterator[str]:
        yield "kv.get"
        raise RuntimeError("registry exploded")

    cleaned = clean_error("function kv.gett() does not exist", known_tools=broken())
    assert cleaned.category == "undefined_function"
    assert cleaned.subject == {"tool": "kv.gett"}


@pytest.mark.parametrize(("raw", "category", "subject", "fragments"), CASES)
def test_a_stated_category_that_matches_the_wording_gets_the_same_hint_as_the_text(
        raw: str, category: str, subject: dict[str, str], fragments: list[str]) -> None:
    """The built-in tools state their category; their PostgreSQL-style wording still gets
    the precise hint (the values, what to do), exactly as if it had been classified."""
    assert clean_error(raw, category=category, known_tools=BUILTIN_TOOLS) == \
        clean_error(raw, known_tools=BUILTIN_TOOLS)


def test_a_stated_category_wins_over_the_wording_of_another_category() -> None:
    """A tool's own category is kept even when its text reads like something else; the
    hint is then its message, made one line."""
    raw = 'duplicate key value violates unique constraint "t_pkey"\nDETAIL:  Key (id)=(7).'
    cleaned = clean_error(raw, category="fdw_error")
    assert (cleaned.category, cleaned.hint) == (
        "fdw_error", 'duplicate key value violates unique constraint "t_pkey" DETAIL: Key '
        "(id)=(7).")
