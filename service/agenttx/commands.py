"""The service distribution's subcommands of `agenttx`: `serve` and `operator`.

Registered in the one `agenttx` parser through the `agenttx.commands` entry points
(the client distribution's `agenttx.cli` builds the tree). Flags mirror the settings in
config.py one to one (`--etcd-endpoints` <-> AGENTTX_ETCD_ENDPOINTS); a flag given on the
command line wins over the environment.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from pydantic import ValidationError

from .config import DefaultPolicy, Settings


def _add_settings_flags(parser: argparse.ArgumentParser) -> None:
    for name, field in Settings.model_fields.items():
        if name == "default_policy":
            for sub, subfield in DefaultPolicy.model_fields.items():
                shown = subfield.get_default(call_default_factory=True)
                if isinstance(shown, dict):
                    shown = json.dumps(shown)
                parser.add_argument(f"--default-policy-{sub.replace('_', '-')}",
                                    dest=f"default_policy__{sub}", default=None,
                                    help=f"{subfield.description} (env "
                                    f"AGENTTX_DEFAULT_POLICY__{sub.upper()}; default "
                                    f"{shown})".replace("%", "%%"))
            continue
        default = field.default if field.default is not None else "unset"
        if name == "effect_channels":
            default = "{}"
        flag = f"--{name.replace('_', '-')}"
        help_text = f"{field.description} (env AGENTTX_{name.upper()}; default {default})"
        if field.annotation is bool:  # `--allow-unauthenticated` or `... false`
            parser.add_argument(flag, dest=name, default=None, nargs="?", const="true",
                                metavar="true|false", help=help_text)
        else:
            parser.add_argument(flag, dest=name, default=None, help=help_text)


def settings_from_args(ns: argparse.Namespace) -> Settings:
    given: dict[str, Any] = {}
    policy: dict[str, Any] = {}
    for key, value in vars(ns).items():
        if value is None or key in ("command", "func"):
            continue
        if key.startswith("default_policy__"):
            policy[key.split("__", 1)[1]] = value
        elif key in Settings.model_fields:
            given[key] = value
    settings = Settings(**given)
    if policy:
        merged = settings.default_policy.model_dump() | policy
        settings = settings.model_copy(update={"default_policy": DefaultPolicy(**merged)})
    return settings


def _serve(ns: argparse.Namespace) -> int:
    from . import logs
    from .server import serve

    try:
        settings = settings_from_args(ns)
    except (ValidationError, ValueError) as exc:
        print(f"agenttx serve: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    logs.setup(settings.log_format, settings.log_level)
    try:
        with asyncio.Runner(loop_factory=_loop_factory(settings.event_loop)) as runner:
            return runner.run(serve(settings))
    except ValueError as exc:  # e.g. a malformed AGENTTX_EFFECT_CHANNELS entry
        print(f"agenttx serve: invalid settings: {exc}", file=sys.stderr)
        return 2


def _loop_factory(name: str) -> Any:
    """uvloop when asked for and installed (measured faster: docs/benchmarks.md),
    else asyncio's own loop."""
    if name == "uvloop":
        try:
            import uvloop
        except ImportError:
            return None
        return uvloop.new_event_loop
    return None


def register_serve(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("serve", help="run the gRPC service",
                                   description="Run one AgentTx service replica.")
    _add_settings_flags(parser)
    parser.set_defaults(func=_serve)


def register_operator(subparsers: argparse._SubParsersAction) -> None:
    """`agenttx operator`: its flags come from the operator's pydantic-settings model."""
    from pydantic_settings import CliSettingsSource

    from agenttx_operator.config import OperatorConfig

    parser = subparsers.add_parser(
        "operator", help="run the Kubernetes operator",
        description="Run the AgentTx operator (AgentTxPolicy and AgentTxToolset resources).")
    source: CliSettingsSource[OperatorConfig] = CliSettingsSource(OperatorConfig,
                                                                  root_parser=parser)

    def run(ns: argparse.Namespace) -> int:
        from agenttx_operator.main import run_config

        try:
            config = OperatorConfig(_cli_settings_source=source(parsed_args=ns))
        except (ValidationError, ValueError) as exc:
            print(f"agenttx operator: invalid settings:\n{exc}", file=sys.stderr)
            return 2
        return run_config(config)

    parser.set_defaults(func=run)


def _operator(argv: list[str]) -> int:
    from agenttx_operator.main import run

    return run(argv)
