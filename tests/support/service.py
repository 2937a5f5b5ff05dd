"""Run real `agenttx serve` processes for tests (never an in-process fake)."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agenttx._proto import agenttx_pb2 as pb
from agenttx._proto import agenttx_pb2_grpc as pb_grpc
from agenttx.store.embedded import free_port


class ServiceProcess:
    """One replica as a child process, with its log captured to a file."""

    def __init__(self, name: str, *, etcd_endpoints: list[str], prefix: str, fs_root: str,
                 workdir: pathlib.Path, env: Mapping[str, str] | None = None,
                 extra_args: list[str] | None = None) -> None:
        self.name = name
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.workdir = workdir
        self.log_path = workdir / f"{name}.log"
        self.env = {**os.environ, "AGENTTX_LOG_FORMAT": "json", "AGENTTX_REPLICA_ID": name,
                    **(env or {})}
        self.args = [sys.executable, "-m", "agenttx", "serve", "--listen", self.address,
                     "--etcd-endpoints", ",".join(etcd_endpoints), "--etcd-prefix", prefix,
                     "--fs-root", fs_root, "--data-dir", str(workdir / f"{name}-data"),
                     "--grace-period-s", "5", *(extra_args or [])]
        self.process: subprocess.Popen[bytes] | None = None
        self._channel: grpc.Channel | None = None

    def start(self, timeout: float = 30.0) -> ServiceProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as logf:
            self.process = subprocess.Popen(self.args, stdout=logf, stderr=subprocess.STDOUT,
                                            env=self.env, start_new_session=True)
        self.wait_serving(timeout)
        return self

    def wait_serving(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        with grpc.insecure_channel(self.address) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            while True:
                if self.process is not None and self.process.poll() is not None:
                    raise RuntimeError(f"{self.name} exited ({self.process.returncode}):\n"
                                       + self.log_path.read_text()[-3000:])
                try:
                    r = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                    if r.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.name} not serving after {timeout}s")
                time.sleep(0.1)

    @property
    def channel(self) -> grpc.Channel:
        if self._channel is None:
            self._channel = grpc.insecure_channel(self.address, options=[
                ("grpc.max_send_message_length", 8 * 1024 * 1024),
                ("grpc.max_receive_message_length", 8 * 1024 * 1024)])
        return self._channel

    @property
    def stub(self) -> pb_grpc.AgentTxServiceStub:
        return pb_grpc.AgentTxServiceStub(self.channel)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        p = self.process
        code: int | None = p.returncode if p else None
        if p is not None and p.poll() is None:
            p.send_signal(sig)
            try:
                code = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                code = p.wait()
        # Closed after the process is gone, so in-flight calls see what a client of a
        # dead server sees (UNAVAILABLE), not a closed local channel.
        if self._channel is not None and sig != signal.SIGKILL:
            self._channel.close()
            self._channel = None
        return code

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def logs(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out


class Agent:
    """A tiny client that keeps track of the next step id, like a real agent would."""

    def __init__(self, stub: pb_grpc.AgentTxServiceStub, agent_id: str = "test-agent",
                 metadata: Mapping[str, str] | None = None, **policy: Any) -> None:
        self.stub = stub
        req = pb.BeginTransactionRequest(agent_id=agent_id, metadata=dict(metadata or {}))
        if policy:
            req.policy.CopyFrom(pb.RollbackPolicy(**policy))
        resp = stub.BeginTransaction(req)
        self.tx = resp.transaction_id
        self.next = resp.next_step_id

    def step(self, tool: str, args: Any = None, *, raw: str | None = None, context: str = "",
             step_id: int | None = None, stub: pb_grpc.AgentTxServiceStub | None = None
             ) -> pb.ExecuteStepResponse:
        body = raw if raw is not None else json.dumps(args if args is not None else {})
        resp = (stub or self.stub).ExecuteStep(pb.ExecuteStepRequest(
            transaction_id=self.tx, step_id=self.next if step_id is None else step_id,
            tool_name=tool, arguments_json=body, raw_context=context))
        self.next = resp.next_step_id
        return resp

    def ok(self, tool: str, args: Any = None, **kw: Any) -> Any:
        resp = self.step(tool, args, **kw)
        assert resp.status == pb.STEP_STATUS_SUCCESS, (resp.error_category, resp.clean_hint)
        return json.loads(resp.output_json)

    def commit(self) -> pb.CommitTransactionResponse:
        return self.stub.CommitTransaction(pb.CommitTransactionRequest(transaction_id=self.tx))

    def rollback(self, to_step: int | None = None, reason: str = "") -> pb.RollbackTransactionResponse:
        req = pb.RollbackTransactionRequest(transaction_id=self.tx, reason=reason)
        if to_step is not None:
            req.to_step = to_step
        resp = self.stub.RollbackTransaction(req)
        self.next = resp.next_step_id
        return resp

    def get(self) -> pb.GetTransactionResponse:
        return self.stub.GetTransaction(pb.GetTransactionRequest(transaction_id=self.tx))
