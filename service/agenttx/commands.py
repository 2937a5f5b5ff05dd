"""The service distribution's subcommands of `agenttx`: `serve` and `operator`.

Registered in the one `agenttx` parser through the `agenttx.commands` entry points
(the client distribution's `agenttx.cli` builds the tree). Both take their flags from
their pydantic-settings model through pydantic-settings' own CLI source, so a flag,
its environment twin and docs/configuration.md (generated from the same models by
scripts/gen_config_docs.py) can never disagree: `--etcd-endpoints` <->
`AGENTTX_ETCD_ENDPOINTS`, `--default-policy.max-local-depth` (also spelled
`--default-policy-max-local-depth`) <-> `AGENTTX_DEFAULT_POLICY__MAX_LOCAL_DEPTH`. A flag
given on the command line wins over the environment.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any, TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings, CliSettingsSource

from .config import Settings

S = TypeVar("S", bound=BaseSettings)

# pydantic-settings names a value by its Python type; these read better in --help.
_METAVARS = {"{str,None}": "str", "{str,null}": "str", "dict[str,Any]": "JSON",
             "list[str]": "str,..."}


def settings_flags(model: type[S], parser: argparse.ArgumentParser) -> CliSettingsSource[S]:
    """Add a flag for every field of `model` to `parser` (pydantic-settings' CLI, with
    the house's conventions below) and return the source that reads them back.

    * A boolean is a bare switch or takes a value: `--allow-unauthenticated`,
      `--allow-unauthenticated true|false`.
    * A nested field is `--default-policy.max-local-depth` (pydantic-settings' spelling)
      or `--default-policy-max-local-depth` (the one `agenttx serve` always accepted).
    * Each help line names the environment variable that sets the same field.
    """
    env_prefix = str(model.model_config.get("env_prefix", ""))

    def add_argument(group: Any, *names: str, **kwargs: Any) -> Any:
        help_text = kwargs.get("help")
        if help_text is None or help_text == argparse.SUPPRESS:
            return group.add_argument(*names, **kwargs)  # e.g. the hidden JSON form
        metavar = str(kwargs.get("metavar", ""))
        if metavar == "bool":
            kwargs.update(nargs="?", const="true", metavar="true|false")
        else:
            kwargs["metavar"] = _METAVARS.get(metavar, metavar)
        if "." in names[0]:
            names = (*names, names[0].replace(".", "-"))
        env = env_prefix + str(kwargs.get("dest", "")).replace(".", "__").upper()
        kwargs["help"] = f"{help_text.replace('(default: )', '(default: empty)')} [env {env}]"
        return group.add_argument(*names, **kwargs)

    return CliSettingsSource(model, root_parser=parser, add_argument_method=add_argument)


def serve_flags(parser: argparse.ArgumentParser) -> CliSettingsSource[Settings]:
    """`agenttx serve`'s flags, one per `Settings` field."""
    return settings_flags(Settings, parser)


def settings_from_args(source: CliSettingsSource[Settings], ns: argparse.Namespace) -> Settings:
    """The serve settings: flags in `ns` over `AGENTTX_*` over the defaults. Raises
    ValidationError / ValueError naming the setting that is wrong."""
    return Settings(_cli_settings_source=source(parsed_args=ns))


def serve_settings(argv: list[str]) -> Settings:
    """The settings `agenttx serve <argv>` runs with (flags over `AGENTTX_*` over the
    defaults): what the chart's container args and env amount to, for its tests."""
    parser = argparse.ArgumentParser(prog="agenttx serve")
    source = serve_flags(parser)
    return settings_from_args(source, parser.parse_args(argv))


def _serve(source: CliSettingsSource[Settings], ns: argparse.Namespace) -> int:
    from . import logs
    from .embedded_etcd import DataDirLock, EmbeddedEtcdError

    try:
        settings = settings_from_args(source, ns)
    except (ValidationError, ValueError) as exc:
        print(f"agenttx serve: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    logs.setup(settings.log_format, settings.log_level)
    if settings.workers > 1:
        from .supervisor import supervise

        try:
            with asyncio.Runner() as runner:
                return runner.run(supervise(settings))
        except EmbeddedEtcdError as exc:
            print(f"agenttx serve: {exc}", file=sys.stderr)
            return 1
    try:
        # The data dir of an embedded etcd is locked before the service's modules load, so
        # a second `agenttx serve` on it is refused at once (docs/architecture.md).
        lock = None if settings.endpoints() else \
            DataDirLock(settings.data_dir, {"listen": settings.listen}).acquire()
        from .server import serve

        with asyncio.Runner(loop_factory=_loop_factory(settings.event_loop)) as runner:
            return runner.run(serve(settings, data_dir_lock=lock))
    except EmbeddedEtcdError as exc:  # e.g. the data dir is held by another agenttx serve
        print(f"agenttx serve: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # e.g. a malformed AGENTTX_EFFECT_CHANNELS entry
        print(f"agenttx serve: invalid settings: {exc}", file=sys.stderr)
        return 2


def _loop_factory(name: str) -> Any:
    from .supervisor import loop_factory

    return loop_factory(name)


def register_serve(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("serve", help="run the gRPC service",
                                   description="Run one AgentTx service replica. Every "
                                   "setting is a flag and an AGENTTX_* variable "
                                   "(docs/configuration.md).")
    source = serve_flags(parser)
    parser.set_defaults(func=lambda ns: _serve(source, ns))


def register_operator(subparsers: argparse._SubParsersAction) -> None:
    """`agenttx operator`: its flags come from the operator's pydantic-settings model."""
    from agenttx_operator.config import OperatorConfig

    parser = subparsers.add_parser(
        "operator", help="run the Kubernetes operator",
        description="Run the AgentTx operator (AgentTxPolicy and AgentTxToolset resources).")
    source = settings_flags(OperatorConfig, parser)

    def run(ns: argparse.Namespace) -> int:
        from agenttx_operator.main import run_config

        try:
            config = OperatorConfig(_cli_settings_source=source(parsed_args=ns))
        except (ValidationError, ValueError) as exc:
            print(f"agenttx operator: invalid settings:\n{exc}", file=sys.stderr)
            return 2
        return run_config(config)

    parser.set_defaults(func=run)

