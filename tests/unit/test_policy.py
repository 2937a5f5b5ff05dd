"""Policy wire format, selection and resolution (docs/recovery.md#the-policy,
docs/kubernetes.md#3-apply-policies). Pure: no etcd."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from agenttx.engine.policy import (
    EffectivePolicy,
    PublishedPolicy,
    RollbackSettings,
    matches,
    parse_published_policy,
    policy_to_json,
    resolve_policy,
    select_policy,
)

FULL = PublishedPolicy(
    namespace="team-a",
    name="strict",
    generation=3,
    priority=10,
    agent_id_prefix="billing-",
    match_metadata={"tier": "prod", "env": "eu"},
    max_local_depth=1,
    max_global_resets=0,
    replay_budget_factor=1.5,
    idle_timeout_s=60,
    sandbox_path="/sandboxes/team-a/strict",
)

MINIMAL = PublishedPolicy(
    namespace="team-a",
    name="open",
    generation=1,
    priority=0,
    agent_id_prefix="",
    match_metadata={},
    max_local_depth=None,
    max_global_resets=None,
    replay_budget_factor=None,
    idle_timeout_s=None,
    sandbox_path=None,
)


# --- wire format -------------------------------------------------------------------------


def test_full_policy_serialises_to_documented_format():
    assert policy_to_json(FULL) == (
        b'{"namespace":"team-a","name":"strict","generation":3,"priority":10,'
        b'"selector":{"agent_id_prefix":"billing-","match_metadata":{"env":"eu","tier":"prod"}},'
        b'"rollback":{"max_local_depth":1,"max_global_resets":0,"replay_budget_factor":1.5},'
        b'"idle_timeout_s":60,"sandbox_path":"/sandboxes/team-a/strict"}'
    )


def test_unset_rollback_fields_are_omitted_and_nulls_written():
    assert json.loads(policy_to_json(MINIMAL)) == {
        "namespace": "team-a",
        "name": "open",
        "generation": 1,
        "priority": 0,
        "selector": {"agent_id_prefix": "", "match_metadata": {}},
        "rollback": {},
        "idle_timeout_s": None,
        "sandbox_path": None,
    }


def test_only_set_rollback_fields_are_present():
    p = replace(MINIMAL, max_global_resets=2)
    assert json.loads(policy_to_json(p))["rollback"] == {"max_global_resets": 2}


@pytest.mark.parametrize(
    "policy", [FULL, MINIMAL, replace(MINIMAL, replay_budget_factor=1000.0)], ids=str
)
def test_round_trip(policy: PublishedPolicy):
    assert parse_published_policy(policy_to_json(policy)) == policy


def test_serialisation_is_stable_regardless_of_metadata_order():
    a = replace(FULL, match_metadata={"env": "eu", "tier": "prod"})
    b = replace(FULL, match_metadata={"tier": "prod", "env": "eu"})
    assert policy_to_json(a) == policy_to_json(b)


def test_integer_factor_parses_as_float():
    raw = (
        b'{"namespace":"n","name":"p","generation":1,"priority":0,'
        b'"rollback":{"replay_budget_factor":2}}'
    )
    p = parse_published_policy(raw)
    assert p.replay_budget_factor == 2.0
    assert isinstance(p.replay_budget_factor, float)


def test_optional_sections_default_and_unknown_keys_are_ignored():
    raw = b'{"namespace":"n","name":"p","generation":1,"priority":0,"future":{"x":1}}'
    assert parse_published_policy(raw) == PublishedPolicy(
        namespace="n",
        name="p",
        generation=1,
        priority=0,
        agent_id_prefix="",
        match_metadata={},
        max_local_depth=None,
        max_global_resets=None,
        replay_budget_factor=None,
        idle_timeout_s=None,
        sandbox_path=None,
    )


def doc(**overrides: Any) -> bytes:
    base: dict[str, Any] = json.loads(policy_to_json(FULL))
    for key, value in overrides.items():
        section, _, sub = key.partition("__")
        if sub:
            base[section][sub] = value
        else:
            base[section] = value
    return json.dumps(base).encode()


BAD = [
    pytest.param(b"{not json", "invalid published policy: malformed JSON", id="bad-json"),
    pytest.param(b"\xff\xfe", "invalid published policy: not UTF-8", id="bad-utf8"),
    pytest.param(b"[1, 2]", "policy must be a JSON object, got list", id="not-object"),
    pytest.param(
        b'{"namespace":"n","name":"p"}', "missing field(s): generation, priority", id="missing"
    ),
    pytest.param(doc(namespace=""), "namespace must be a non-empty string, got ''", id="ns"),
    pytest.param(doc(name=5), "name must be a non-empty string, got 5", id="name-type"),
    pytest.param(doc(generation="3"), "generation must be an integer, got '3'", id="gen-type"),
    pytest.param(doc(generation=-1), "generation must be >= 0, got -1", id="gen-neg"),
    pytest.param(doc(priority=True), "priority must be an integer, got True", id="prio-bool"),
    pytest.param(doc(selector=[]), "selector must be a JSON object, got list", id="selector"),
    pytest.param(
        doc(selector__agent_id_prefix=1),
        "selector.agent_id_prefix must be a string, got 1",
        id="prefix-type",
    ),
    pytest.param(
        doc(selector__match_metadata={"a": 1}),
        "selector.match_metadata must map strings to strings",
        id="metadata-values",
    ),
    pytest.param(
        doc(rollback__max_local_depth=17),
        "rollback.max_local_depth must be between 0 and 16, got 17",
        id="depth-high",
    ),
    pytest.param(
        doc(rollback__max_local_depth=-1),
        "rollback.max_local_depth must be between 0 and 16, got -1",
        id="depth-low",
    ),
    pytest.param(
        doc(rollback__max_local_depth=1.5),
        "rollback.max_local_depth must be an integer between 0 and 16, got 1.5",
        id="depth-float",
    ),
    pytest.param(
        doc(rollback__max_global_resets=17),
        "rollback.max_global_resets must be between 0 and 16, got 17",
        id="resets-high",
    ),
    pytest.param(
        doc(rollback__replay_budget_factor=0.09),
        "rollback.replay_budget_factor must be a finite number between 0.1 and 1000, got 0.09",
        id="factor-low",
    ),
    pytest.param(
        doc(rollback__replay_budget_factor=1000.5),
        "rollback.replay_budget_factor must be a finite number between 0.1 and 1000, got 1000.5",
        id="factor-high",
    ),
    pytest.param(
        doc(rollback__replay_budget_factor=float("nan")),
        "rollback.replay_budget_factor must be a finite number between 0.1 and 1000, got nan",
        id="factor-nan",
    ),
    pytest.param(
        doc(rollback__replay_budget_factor="2"),
        "rollback.replay_budget_factor must be a finite number between 0.1 and 1000, got '2'",
        id="factor-str",
    ),
    pytest.param(
        doc(idle_timeout_s=0),
        "idle_timeout_s must be a positive integer or null, got 0",
        id="idle-zero",
    ),
    pytest.param(
        doc(sandbox_path="rel/dir"),
        "sandbox_path must be an absolute path or null, got 'rel/dir'",
        id="sandbox-relative",
    ),
]


@pytest.mark.parametrize(("raw", "message"), BAD)
def test_bad_published_policy_raises_clear_value_error(raw: bytes, message: str):
    with pytest.raises(ValueError) as err:
        parse_published_policy(raw)
    assert str(err.value).startswith("invalid published policy: ")
    assert message in str(err.value)


# --- RollbackSettings --------------------------------------------------------------------


def test_rollback_settings_defaults_match_spec():
    s = RollbackSettings()
    assert (s.max_local_depth, s.max_global_resets, s.replay_budget_factor) == (3, 1, 2.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_local_depth": 0, "max_global_resets": 0, "replay_budget_factor": 0.1},
        {"max_local_depth": 16, "max_global_resets": 16, "replay_budget_factor": 1000},
    ],
    ids=["lower-bounds", "upper-bounds"],
)
def test_rollback_settings_accepts_range_edges(kwargs: dict[str, Any]):
    s = RollbackSettings(**kwargs)
    assert s.replay_budget_factor == float(kwargs["replay_budget_factor"])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_local_depth": 17}, "max_local_depth must be between 0 and 16, got 17"),
        ({"max_global_resets": -1}, "max_global_resets must be between 0 and 16, got -1"),
        ({"max_global_resets": True}, "max_global_resets must be an integer between 0 and 16"),
        (
            {"replay_budget_factor": float("inf")},
            "replay_budget_factor must be a finite number between 0.1 and 1000, got inf",
        ),
        (
            {"replay_budget_factor": 0.0},
            "replay_budget_factor must be a finite number between 0.1 and 1000, got 0.0",
        ),
    ],
)
def test_rollback_settings_rejects_out_of_range(kwargs: dict[str, Any], message: str):
    with pytest.raises(ValueError, match="^" + message.replace(".", r"\.")):
        RollbackSettings(**kwargs)


# --- matching and selection --------------------------------------------------------------


def pol(name: str, **kw: Any) -> PublishedPolicy:
    return PublishedPolicy(
        namespace=kw.pop("namespace", "ns"),
        name=name,
        generation=kw.pop("generation", 1),
        priority=kw.pop("priority", 0),
        agent_id_prefix=kw.pop("agent_id_prefix", ""),
        match_metadata=kw.pop("match_metadata", {}),
        max_local_depth=None,
        max_global_resets=None,
        replay_budget_factor=None,
        idle_timeout_s=None,
        sandbox_path=None,
    )


@pytest.mark.parametrize(
    ("policy", "agent_id", "metadata", "expected"),
    [
        (pol("any"), "", {}, True),
        (pol("any"), "whatever", {"x": "y"}, True),
        (pol("p", agent_id_prefix="bill"), "billing-1", {}, True),
        (pol("p", agent_id_prefix="bill"), "bil", {}, False),
        (pol("p", agent_id_prefix="bill"), "Billing-1", {}, False),
        (pol("p", match_metadata={"tier": "prod"}), "a", {"tier": "prod", "x": "1"}, True),
        (pol("p", match_metadata={"tier": "prod"}), "a", {"tier": "dev"}, False),
        (pol("p", match_metadata={"tier": "prod"}), "a", {}, False),
        (
            pol("p", agent_id_prefix="b", match_metadata={"t": "1", "u": "2"}),
            "b1",
            {"t": "1"},
            False,
        ),
        (pol("p", agent_id_prefix="b", match_metadata={"t": "1"}), "a1", {"t": "1"}, False),
    ],
)
def test_matches(policy: PublishedPolicy, agent_id: str, metadata: dict[str, str], expected: bool):
    assert matches(policy, agent_id, metadata) is expected


def test_select_none_when_nothing_matches():
    assert select_policy([pol("p", agent_id_prefix="x")], "agent", {}) is None
    assert select_policy([], "agent", {}) is None


def test_select_highest_priority_wins_over_specificity():
    low = pol("low", priority=1, agent_id_prefix="billing-", match_metadata={"t": "1"})
    high = pol("high", priority=2)
    for order in ([low, high], [high, low]):
        assert select_policy(order, "billing-1", {"t": "1"}) == high


def test_select_longest_prefix_breaks_priority_tie():
    short = pol("short", agent_id_prefix="b", match_metadata={"t": "1", "u": "2"})
    long = pol("long", agent_id_prefix="bill")
    for order in ([short, long], [long, short]):
        assert select_policy(order, "billing", {"t": "1", "u": "2"}) == long


def test_select_most_metadata_keys_breaks_prefix_tie():
    one = pol("a-one", agent_id_prefix="b", match_metadata={"t": "1"})
    two = pol("z-two", agent_id_prefix="b", match_metadata={"t": "1", "u": "2"})
    for order in ([one, two], [two, one]):
        assert select_policy(order, "b", {"t": "1", "u": "2"}) == two


def test_select_name_breaks_remaining_tie_ascending_by_namespace_then_name():
    a = pol("zz", namespace="alpha")
    b = pol("aa", namespace="beta")
    c = pol("ab", namespace="beta")
    for order in ([a, b, c], [c, b, a], [b, c, a]):
        assert select_policy(order, "agent", {}) == a
    for order in ([b, c], [c, b]):
        assert select_policy(order, "agent", {}) == b


def test_select_ignores_non_matching_more_specific_policies():
    winner = pol("generic")
    other = pol("other", priority=100, agent_id_prefix="x")
    assert select_policy([other, winner], "agent", {}) == winner


# --- resolution --------------------------------------------------------------------------

DEFAULTS = RollbackSettings(max_local_depth=3, max_global_resets=1, replay_budget_factor=2.0)


def resolve(published: PublishedPolicy | None = None, **request: Any) -> EffectivePolicy:
    return resolve_policy(
        defaults=DEFAULTS,
        default_idle_timeout_s=900,
        published=published,
        request_max_local_depth=request.get("depth"),
        request_max_global_resets=request.get("resets"),
        request_replay_budget_factor=request.get("factor"),
    )


def test_resolve_server_defaults_only():
    assert resolve() == EffectivePolicy(
        rollback=RollbackSettings(3, 1, 2.0),
        idle_timeout_s=900,
        sandbox_path=None,
        source="server-default",
    )


def test_resolve_published_policy_with_nothing_set_keeps_defaults_but_names_source():
    assert resolve(MINIMAL) == EffectivePolicy(
        rollback=RollbackSettings(3, 1, 2.0),
        idle_timeout_s=900,
        sandbox_path=None,
        source="team-a/open@1",
    )


@pytest.mark.parametrize(
    ("published_field", "value", "expected"),
    [
        ("max_local_depth", 7, RollbackSettings(7, 1, 2.0)),
        ("max_global_resets", 0, RollbackSettings(3, 0, 2.0)),
        ("replay_budget_factor", 4.5, RollbackSettings(3, 1, 4.5)),
    ],
)
def test_resolve_each_published_rollback_field_independently(
    published_field: str, value: Any, expected: RollbackSettings
):
    eff = resolve(replace(MINIMAL, **{published_field: value}))
    assert eff.rollback == expected
    assert eff.idle_timeout_s == 900


def test_resolve_published_idle_timeout_and_sandbox():
    eff = resolve(replace(MINIMAL, idle_timeout_s=30, sandbox_path="/sandboxes/team-a/open"))
    assert eff == EffectivePolicy(
        rollback=RollbackSettings(3, 1, 2.0),
        idle_timeout_s=30,
        sandbox_path="/sandboxes/team-a/open",
        source="team-a/open@1",
    )


@pytest.mark.parametrize(
    ("request_field", "value", "expected"),
    [
        ("depth", 0, RollbackSettings(0, 1, 2.0)),
        ("resets", 16, RollbackSettings(3, 16, 2.0)),
        ("factor", 0.1, RollbackSettings(3, 1, 0.1)),
    ],
)
def test_resolve_each_request_field_over_defaults(
    request_field: str, value: Any, expected: RollbackSettings
):
    assert resolve(**{request_field: value}).rollback == expected


@pytest.mark.parametrize(
    ("request_field", "value", "expected"),
    [
        ("depth", 5, RollbackSettings(5, 0, 1.5)),
        ("resets", 2, RollbackSettings(1, 2, 1.5)),
        ("factor", 9.0, RollbackSettings(1, 0, 9.0)),
    ],
)
def test_resolve_each_request_field_over_published(
    request_field: str, value: Any, expected: RollbackSettings
):
    eff = resolve(FULL, **{request_field: value})
    assert eff == EffectivePolicy(
        rollback=expected,
        idle_timeout_s=60,
        sandbox_path="/sandboxes/team-a/strict",
        source="team-a/strict@3",
    )


def test_resolve_all_three_layers_at_once():
    published = replace(MINIMAL, max_local_depth=8, replay_budget_factor=3.0)
    eff = resolve(published, factor=5.0)
    assert eff.rollback == RollbackSettings(8, 1, 5.0)


def test_resolve_rejects_out_of_range_request_value():
    with pytest.raises(ValueError, match="max_local_depth must be between 0 and 16, got 17"):
        resolve(depth=17)
