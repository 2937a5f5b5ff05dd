"""OpenTelemetry traces (docs/operations.md#traces): a server span per RPC, an `execute_tool <tool>` span
per step, spans for etcd round trips and undo actions.

Configured by the standard environment, like any OpenTelemetry SDK user:
`OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) turns it on, with
`OTEL_EXPORTER_OTLP_PROTOCOL` (`grpc`, default, or `http/protobuf`), `OTEL_SERVICE_NAME`
(default `agenttx`), `OTEL_TRACES_SAMPLER` etc. read by the SDK itself;
`OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` keeps it off. An incoming W3C
`traceparent` (gRPC metadata) makes the RPC span a child of the agent's own trace.

Off unless configured, and then free: every helper checks one module flag and returns a
shared no-op context manager, so the hot path pays a function call, not a span.
Span names and attributes follow the OpenTelemetry semantic conventions: RPC spans
(`rpc.system=grpc`, `rpc.service`, `rpc.method`, `rpc.grpc.status_code`), GenAI
tool-execution spans (`gen_ai.operation.name=execute_tool`, `gen_ai.tool.name`,
`gen_ai.tool.call.id`), database client spans (`db.system.name=etcd`,
`db.operation.name`).

Nothing here imports grpc: the servicer hands in the metadata it received.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

log = logging.getLogger(__name__)

SERVICE = "agenttx.v1.AgentTxService"

_NULL = contextlib.nullcontext()
_state: dict[str, Any] = {"tracer": None, "provider": None}


def enabled() -> bool:
    return _state["tracer"] is not None


def configured(env: Mapping[str, str] | None = None) -> bool:
    """Whether the standard OTEL_* environment asks for traces."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "otlp").lower() == "none":
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or
                env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def setup(provider: Any = None) -> bool:
    """Start tracing: with `provider` (tests pass one with an in-memory exporter), or
    from the OTEL_* environment. Returns whether traces are on."""
    from opentelemetry import trace

    if provider is None:
        if not configured():
            return False
        provider = _provider_from_env()
    _state["provider"] = provider
    _state["tracer"] = provider.get_tracer("agenttx")
    if provider is not trace.get_tracer_provider():
        with contextlib.suppress(Exception):
            trace.set_tracer_provider(provider)
    log.info("tracing on", extra={"exporter": type(provider).__name__})
    return True


def shutdown() -> None:
    provider = _state["provider"]
    _state["tracer"] = _state["provider"] = None
    if provider is not None and hasattr(provider, "shutdown"):
        with contextlib.suppress(Exception):
            provider.shutdown()


def _provider_from_env() -> Any:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or
                os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc").lower()
    if protocol.startswith("http"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[assignment]
            OTLPSpanExporter,
        )
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "agenttx")})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


# ---- spans ------------------------------------------------------------------------------

@contextlib.contextmanager
def _span(name: str, kind: str, attributes: Mapping[str, Any],
          parent: Any = None) -> Iterator[Any]:
    from opentelemetry.trace import SpanKind, Status, StatusCode

    tracer = _state["tracer"]
    with tracer.start_as_current_span(name, context=parent, kind=getattr(SpanKind, kind),
                                      attributes=dict(attributes),
                                      record_exception=True, set_status_on_exception=True) as span:
        try:
            yield span
        except BaseException as exc:
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise


def rpc_span(method: str, metadata: Callable[[], Iterable[tuple[str, Any]] | None] | None
             ) -> Any:
    """The server span of one AgentTx RPC, continuing the caller's trace if it sent one
    (`metadata` is called only when tracing is on)."""
    if _state["tracer"] is None:
        return _NULL
    from opentelemetry.propagate import extract

    pairs = metadata() if metadata is not None else None
    carrier = {k.lower(): v for k, v in (pairs or ()) if isinstance(v, str)}
    return _span(f"{SERVICE}/{method}", "SERVER",
                 {"rpc.system": "grpc", "rpc.service": SERVICE, "rpc.method": method},
                 parent=extract(carrier))


def set_rpc_status(span: Any, code_name: str, code_value: int) -> None:
    if span is None or _state["tracer"] is None:
        return
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("rpc.grpc.status_code", code_value)
    if code_name != "OK":
        span.set_status(Status(StatusCode.ERROR, code_name))


def tool_span(tool: str, tx_id: str, step_id: int) -> Any:
    """`execute_tool <tool>`: one step, from resolving its references to its CAS."""
    if _state["tracer"] is None:
        return _NULL
    return _span(f"execute_tool {tool}", "INTERNAL",
                 {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
                  "gen_ai.tool.call.id": f"{tx_id}/{step_id}", "agenttx.step_id": step_id})


def etcd_span(operation: str) -> Any:
    if _state["tracer"] is None:
        return _NULL
    return _span(f"etcd {operation}", "CLIENT",
                 {"db.system.name": "etcd", "db.operation.name": operation})


def undo_span(tool: str, step_id: int) -> Any:
    if _state["tracer"] is None:
        return _NULL
    return _span(f"undo {tool}", "INTERNAL", {"agenttx.step_id": step_id,
                                              "gen_ai.tool.name": tool})


def annotate(**attributes: Any) -> None:
    """Add attributes to the current span (no-op when tracing is off)."""
    if _state["tracer"] is None:
        return
    from opentelemetry import trace

    span = trace.get_current_span()
    for key, value in attributes.items():
        if value is not None:
            span.set_attribute(key, value)
