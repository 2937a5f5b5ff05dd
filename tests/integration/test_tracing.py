"""OpenTelemetry traces (docs/operations.md#traces) from a real replica and a real etcd: the RPC ->
execute_tool -> etcd hierarchy with a propagated parent trace, captured by the SDK's
in-memory exporter in-process, and the OTLP exporter configured by the standard OTEL_*
environment shipping spans to a loopback OTLP/HTTP receiver."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agenttx.config import Settings
from agenttx.embedded_etcd import free_port
from agenttx.observability import tracing
from agenttx.server import serve
from agenttx.v1 import agenttx_pb2 as pb
from agenttx.v1 import agenttx_pb2_grpc as pb_grpc
from support.service import Agent, ServiceProcess
from support.waiting import eventually, slack

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


async def test_spans_form_the_rpc_tool_etcd_hierarchy_under_the_callers_trace(
        etcd_endpoint, scratch, etcd_prefix):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.setup(provider)
    port = free_port()
    settings = Settings(listen=f"127.0.0.1:{port}", etcd_endpoints=etcd_endpoint,
                        etcd_prefix=etcd_prefix, fs_root=str(scratch / "trace-sb"),
                        data_dir=str(scratch / "trace-data"), grace_period_s=1)
    ready, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(serve(settings, ready=ready, stop=stop))
    try:
        await asyncio.wait_for(ready.wait(), 30)
        md = (("traceparent", TRACEPARENT),)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = pb_grpc.AgentTxServiceStub(ch)
            tx = (await stub.BeginTransaction(pb.BeginTransactionRequest(agent_id="t"),
                                              metadata=md)).transaction_id
            step = await stub.ExecuteStep(pb.ExecuteStepRequest(
                transaction_id=tx, step_id=1, tool_name="kv.put",
                arguments_json=json.dumps({"key": f"traced-{uuid.uuid4().hex}", "value": 1})),
                metadata=md)
            assert step.status == pb.STEP_STATUS_SUCCESS
            await stub.CommitTransaction(pb.CommitTransactionRequest(transaction_id=tx),
                                         metadata=md)
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.GetTransaction(pb.GetTransactionRequest(transaction_id=tx))
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        tracing.shutdown()
    spans = exporter.get_finished_spans()
    by_name: dict[str, list] = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)
    rpc = by_name["agenttx.v1.AgentTxService/ExecuteStep"][0]
    tool = by_name["execute_tool kv.put"][0]
    etcd_step = [s for s in by_name["etcd step"] if s.parent and s.parent.span_id == tool.context.span_id]
    assert etcd_step, sorted(by_name)
    # the hierarchy, and the agent's trace continued into AgentTx
    assert tool.parent.span_id == rpc.context.span_id
    assert format(rpc.context.trace_id, "032x") == TRACE_ID
    assert format(rpc.parent.span_id, "016x") == PARENT_ID
    assert rpc.kind.name == "SERVER" and etcd_step[0].kind.name == "CLIENT"
    assert rpc.attributes["rpc.system"] == "grpc"
    assert rpc.attributes["rpc.service"] == "agenttx.v1.AgentTxService"
    assert rpc.attributes["rpc.method"] == "ExecuteStep"
    assert rpc.attributes["rpc.grpc.status_code"] == 0
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["gen_ai.tool.name"] == "kv.put"
    assert tool.attributes["gen_ai.tool.call.id"] == f"{tx}/1"
    assert etcd_step[0].attributes["db.system.name"] == "etcd"
    commit = by_name["agenttx.v1.AgentTxService/CommitTransaction"][0]
    assert format(commit.context.trace_id, "032x") == TRACE_ID
    # a call without a traceparent starts its own trace; its error is on the span
    get = by_name["agenttx.v1.AgentTxService/GetTransaction"][0]
    assert format(get.context.trace_id, "032x") != TRACE_ID and get.parent is None
    assert get.attributes["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]
    assert get.status.status_code.name == "ERROR"


class _OtlpReceiver:
    """A loopback OTLP/HTTP trace receiver (POST /v1/traces, protobuf bodies)."""

    def __init__(self) -> None:
        self.spans: list = []
        self.paths: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                receiver.paths.append(self.path)
                for rs in request.resource_spans:
                    for ss in rs.scope_spans:
                        receiver.spans.extend(ss.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                out = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_the_otlp_exporter_follows_the_standard_environment(etcd, scratch, sandbox):
    receiver = _OtlpReceiver()
    svc = ServiceProcess("otlp", etcd_endpoints=etcd.endpoints,
                         prefix=f"/agenttx-otlp-{uuid.uuid4().hex[:6]}", fs_root=str(sandbox),
                         workdir=scratch / "otlp",
                         env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                              "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                              "OTEL_SERVICE_NAME": "agenttx-test",
                              "OTEL_BSP_SCHEDULE_DELAY": "100"}).start()
    try:
        agent = Agent(svc.stub)
        agent.ok("kv.put", {"key": f"otlp-{uuid.uuid4().hex}", "value": 1})
        assert agent.commit().committed
        wanted = {"agenttx.v1.AgentTxService/ExecuteStep", "execute_tool kv.put", "etcd step"}
        # the batch span processor exports every OTEL_BSP_SCHEDULE_DELAY (0.1 s)
        eventually(lambda: wanted <= {s.name for s in receiver.spans}, slack(0.1),
                   "the spans reach the OTLP receiver")
        assert set(receiver.paths) == {"/v1/traces"}
    finally:
        svc.stop()
        receiver.server.shutdown()


def test_tracing_is_off_without_an_exporter_configured():
    code = ("from agenttx.observability import tracing; print(tracing.setup(), "
            "tracing.enabled(), tracing.tool_span('kv.put', 't', 1) is tracing.etcd_span('x'))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True).stdout.split()
    assert out == ["False", "False", "True"]  # one shared no-op: no span, no cost
