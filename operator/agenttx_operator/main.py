"""Entry point of `agenttx operator`: parse settings, run kopf in its own event loop.

Why its own loop: the operator is its own process in the chart (one replica,
`Recreate`), and even when embedded it must never share the gRPC server's loop, where a
slow API call would stall transactions. `run()` owns an `asyncio.run`; `operate()` is
the same thing as a coroutine for tests, which run it in a thread with a stop flag.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Callable

import kopf
from pydantic import ValidationError

from agenttx.store.client import connect

from . import handlers, toolset_handlers  # noqa: F401  (registers the toolset handlers)
from .config import OperatorConfig
from .kube import Credentials, KubeClient, load_credentials
from .sandboxes import Target

log = logging.getLogger(__name__)


def build_target(config: OperatorConfig) -> Target:
    return Target(
        service_namespace=config.resolved_service_namespace(),
        deployment=config.service_deployment,
        container=config.service_container,
        mount_root=config.sandbox_mount_root,
    )


async def operate(
    config: OperatorConfig,
    *,
    credentials: Credentials | Callable[[], Credentials] = load_credentials,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
) -> None:
    """Run the operator until `stop_flag` is set (or SIGTERM/SIGINT in the main thread).

    The etcd connection and the API client are created here, in the loop that uses them.
    """
    store = connect(
        config.etcd_endpoints, timeout=config.etcd_timeout_s, ca_file=config.etcd_ca_file,
        cert_file=config.etcd_cert_file, key_file=config.etcd_key_file,
    )
    kube = KubeClient(credentials)
    runtime = handlers.Runtime(config=config, target=build_target(config), store=store, kube=kube)
    try:
        await kopf.operator(
            registry=kopf.get_default_registry(),
            standalone=True,
            clusterwide=not config.namespaces,
            namespaces=config.namespaces,
            liveness_endpoint=f"http://{config.liveness_host}:{config.liveness_port}/healthz",
            memo=kopf.Memo(runtime=runtime),
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        await kube.close()
        await store.close()


def _configure_logging(config: OperatorConfig) -> None:
    formats = {"json": kopf.LogFormat.JSON, "plain": kopf.LogFormat.PLAIN,
               "full": kopf.LogFormat.FULL}
    kopf.configure(verbose=config.verbose, log_format=formats[config.log_format])


def parse_config(argv: list[str]) -> OperatorConfig:
    """Settings from flags (`--etcd-endpoints a:2379,b:2379`) over env over defaults."""
    return OperatorConfig(_cli_parse_args=argv)


def run(argv: list[str] | None = None) -> int:
    """`agenttx operator [flags]`: returns the process exit code.

    `argv` are the flags after `operator`; None reads `sys.argv[1:]` (dropping a leading
    "operator" so the function works as a console-script body too).
    """
    if argv is None:
        argv = sys.argv[1:]
        if argv[:1] == ["operator"]:
            argv = argv[1:]
    try:
        config = parse_config(argv)
    except (ValidationError, ValueError) as exc:
        print(f"agenttx operator: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    return run_config(config)


def run_config(config: OperatorConfig) -> int:
    """Run the operator with parsed settings until stopped; the process exit code."""
    try:
        config.resolved_service_namespace()
    except ValueError as exc:
        print(f"agenttx operator: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    _configure_logging(config)
    try:
        asyncio.run(operate(config))
    except KeyboardInterrupt:
        pass
    except Exception as exc:  # a failed startup (e.g. the CRD is missing): exit non-zero
        log.error("operator stopped: %s", exc, exc_info=True)
        return 1
    return 0
