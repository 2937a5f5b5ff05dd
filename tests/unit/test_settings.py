"""`agenttx serve` and `agenttx operator` take their flags from their pydantic-settings
models (`agenttx.commands.settings_flags`): every field is a flag and an environment
twin, the spellings the chart, the docs and the tests use keep working, and a flag wins
over its twin. Pure: parsing only."""

from __future__ import annotations

import argparse

import pytest
from pydantic import ValidationError

from agenttx.commands import serve_flags, settings_flags, settings_from_args
from agenttx.config import DefaultPolicy, Settings
from agenttx_operator.config import OperatorConfig


def parse(argv: list[str]) -> Settings:
    parser = argparse.ArgumentParser()
    source = serve_flags(parser)
    return settings_from_args(source, parser.parse_args(argv))


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}


def test_every_serve_setting_is_a_flag_in_the_spelling_serve_always_accepted() -> None:
    parser = argparse.ArgumentParser()
    serve_flags(parser)
    flags = option_strings(parser)
    top = {f"--{name.replace('_', '-')}" for name in Settings.model_fields
           if name != "default_policy"}
    nested = {f"--default-policy{sep}{name.replace('_', '-')}"
              for name in DefaultPolicy.model_fields for sep in (".", "-")}
    assert top | nested <= flags
    # The spellings in use outside this package (chart, README, docs, test harness).
    assert {"--listen", "--etcd-endpoints", "--etcd-prefix", "--fs-root", "--data-dir",
            "--grace-period-s", "--metrics-listen", "--allow-unauthenticated",
            "--tx-idle-timeout-s", "--etcd-max-txn-ops", "--auth-tokens-file"} <= flags


def test_a_flag_wins_over_its_environment_twin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTTX_LISTEN", "127.0.0.1:1111")
    monkeypatch.setenv("AGENTTX_ETCD_PREFIX", "/from-env")
    settings = parse(["--listen", "127.0.0.1:2222"])
    assert settings.listen == "127.0.0.1:2222"
    assert settings.etcd_prefix == "/from-env"


def test_the_default_policy_merges_flags_in_either_spelling_with_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTTX_DEFAULT_POLICY__MAX_GLOBAL_RESETS", "0")
    monkeypatch.setenv("AGENTTX_DEFAULT_POLICY__MAX_LOCAL_DEPTH", "9")
    settings = parse(["--default-policy-max-local-depth", "2",
                      "--default-policy.replay-budget-factor", "1.5"])
    assert settings.default_policy == DefaultPolicy(max_local_depth=2, max_global_resets=0,
                                                    replay_budget_factor=1.5)


@pytest.mark.parametrize("argv, field", [
    (["--default-policy-max-local-depth", "17"], "max_local_depth"),
    (["--etcd-timeout-s", "0"], "etcd_timeout_s"),
    (["--failpoints", "fs.write.after_intent=explode"], "failpoints"),
    (["--effect-channels", "not json"], "effect_channels"),
])
def test_a_bad_value_is_refused_naming_the_setting(argv: list[str], field: str) -> None:
    with pytest.raises((ValidationError, ValueError)) as err:
        parse(argv)
    assert field in str(err.value)


def test_effect_channels_take_the_json_object_as_a_flag_or_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    hooks = '{"hooks": {"kind": "webhook", "url": "http://127.0.0.1:9/h"}}'
    assert parse(["--effect-channels", hooks]).effect_channels == {
        "hooks": {"kind": "webhook", "url": "http://127.0.0.1:9/h"}}
    monkeypatch.setenv("AGENTTX_EFFECT_CHANNELS", '{"audit": {"kind": "log"}}')
    assert parse([]).effect_channels == {"audit": {"kind": "log"}}


def test_help_names_each_flags_environment_twin() -> None:
    parser = argparse.ArgumentParser()
    serve_flags(parser)
    text = " ".join(parser.format_help().split())  # argparse wraps lines
    assert "[env AGENTTX_ETCD_ENDPOINTS]" in text
    assert "[env AGENTTX_DEFAULT_POLICY__REPLAY_BUDGET_FACTOR]" in text
    op = argparse.ArgumentParser()
    settings_flags(OperatorConfig, op)
    assert "[env AGENTTX_OPERATOR_ETCD_ENDPOINTS]" in " ".join(op.format_help().split())
    assert "==SUPPRESS==" not in text
