"""Print the worked transcripts of docs/recovery.md by running them against a real service.

Why: the transcripts in the docs must be what the service really answers, not what we
think it answers. This starts a real etcd and `agenttx serve` in a temporary folder
(`agenttx.testing.serve`), plays one scenario per rollback strategy through gRPC, and
prints each call and the response fields that matter as Markdown. Paste the output into
docs/recovery.md.

    .venv/bin/python scripts/recovery_transcripts.py

With the example tools installed (`pip install -e examples/agenttx-example-tools`), hints
that list tool names list theirs too.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import tempfile
from typing import Any

import grpc

from agenttx.testing import serve
from agenttx.v1 import agenttx_pb2 as pb
from agenttx.v1 import agenttx_pb2_grpc as pb_grpc

STATUS = {v: k.removeprefix("STEP_STATUS_") for k, v in pb.StepStatus.items()}
STRATEGY = {v: k.removeprefix("ROLLBACK_STRATEGY_") for k, v in pb.RollbackStrategy.items()}
TX_STATUS = {v: k.removeprefix("TRANSACTION_STATUS_") for k, v in pb.TransactionStatus.items()}


class Transcript:
    def __init__(self, stub: pb_grpc.AgentTxServiceStub, sandbox: pathlib.Path) -> None:
        self.stub, self.sandbox = stub, sandbox
        self.lines: list[str] = []
        self.tx = ""
        self.next = 0

    def say(self, text: str) -> None:
        self.lines.append(text)

    def begin(self, **policy: Any) -> None:
        req = pb.BeginTransactionRequest(agent_id="docs-agent")
        if policy:
            req.policy.CopyFrom(pb.RollbackPolicy(**policy))
        resp = self.stub.BeginTransaction(req)
        self.tx, self.next = resp.transaction_id, resp.next_step_id
        shown = ", ".join(f"{k}={v}" for k, v in policy.items())
        self.say(f"→ BeginTransaction(policy: {shown or 'server defaults'})")
        self.say(f"← next_step_id={resp.next_step_id}")

    def step(self, tool: str, args: Any, context: str = "") -> pb.ExecuteStepResponse:
        body = json.dumps(args)
        resp = self.stub.ExecuteStep(pb.ExecuteStepRequest(
            transaction_id=self.tx, step_id=self.next, tool_name=tool, arguments_json=body,
            raw_context=context))
        self.say(f"→ ExecuteStep(step_id={self.next}, {tool} {body})")
        self.next = resp.next_step_id
        if resp.status == pb.STEP_STATUS_SUCCESS:
            self.say(f"← SUCCESS next_step_id={resp.next_step_id} output={resp.output_json}")
            return resp
        self.say(f"← {STATUS[resp.status]} strategy={STRATEGY[resp.strategy]} "
                 f"rollback_to_step={resp.rollback_to_step} next_step_id={resp.next_step_id} "
                 f"context_reset={str(resp.context_reset).lower()} "
                 f"rollback_latency_ms={resp.rollback_latency_ms:.1f}")
        self.say(f"  error_category={resp.error_category}")
        self.say(f"  clean_hint={resp.clean_hint!r}")
        self.say(f"  constraints={list(resp.constraints)!r}")
        if resp.abort_reason:
            self.say(f"  abort_reason={resp.abort_reason!r}")
        if resp.compensation_errors:
            self.say(f"  compensation_errors={list(resp.compensation_errors)!r}")
        return resp

    def get(self) -> None:
        self.say("→ GetTransaction")
        try:
            v = self.stub.GetTransaction(pb.GetTransactionRequest(transaction_id=self.tx))
        except grpc.RpcError as err:
            self.say(f"← {err.code().name}: {err.details()}")
            return
        ctx = [(c.step_id, c.tool_name, c.raw_context) for c in v.context]
        self.say(f"← status={TX_STATUS[v.status]} next_step_id={v.next_step_id} "
                 f"global_resets={v.global_resets} context={ctx!r}")
        self.say(f"  constraints={list(v.constraints)!r}")

    def rollback(self, to_step: int | None = None, *, quiet: bool = False) -> None:
        req = pb.RollbackTransactionRequest(transaction_id=self.tx, reason="docs")
        if to_step is not None:
            req.to_step = to_step
        if quiet:  # clean-up between scenarios, not part of the transcript
            self.stub.RollbackTransaction(req)
            return
        self.say(f"→ RollbackTransaction(to_step={to_step if to_step is not None else 'unset'})")
        r = self.stub.RollbackTransaction(req)
        self.next = r.next_step_id
        self.say(f"← rolled_back={str(r.rolled_back).lower()} next_step_id={r.next_step_id} "
                 f"compensations_run={r.compensations_run} "
                 f"compensation_errors={list(r.compensation_errors)!r}")

    def call(self, name: str, request: Any, label: str) -> None:
        self.say(f"→ {label}")
        try:
            getattr(self.stub, name)(request)
            self.say("← OK")
        except grpc.RpcError as err:
            self.say(f"← {err.code().name}: {err.details()}")

    def disk(self, rel: str) -> None:
        path = self.sandbox / rel
        if path.is_dir():
            state = "a directory"
        elif path.exists():
            state = repr(path.read_text())
        else:
            state = "absent"
        self.say(f"  (on disk: {rel} is {state})")

    def note(self, text: str) -> None:
        self.say(f"# {text}")


def local_then_jump(t: Transcript) -> None:
    t.begin(max_local_depth=1)
    t.step("record.insert", {"table": "orders", "id": "o-7", "fields": {"sku": "A"}}, "order o-7")
    t.step("kv.put", {"key": "cart", "value": ["A"]}, "cart")
    t.step("record.insert", {"table": "orders", "id": "o-7", "fields": {"sku": "B"}})
    t.note("attempt 2 > max_local_depth 1: step 3 touched row orders/o-7, written by step 1")
    t.step("record.insert", {"table": "orders", "id": "o-7", "fields": {"sku": "B"}})
    t.get()
    t.rollback(quiet=True)


def culprit_jump(t: Transcript) -> None:
    t.sandbox.joinpath("drafts").mkdir(exist_ok=True)
    t.begin()
    t.step("kv.get", {"key": "customer-of-the-day"}, "looked up today's customer")
    t.step("fs.write", {"path": "drafts/invoice.txt", "contents": "Invoice for ${steps.1.value}"},
           "drafted the invoice")
    t.disk("drafts/invoice.txt")
    t.step("record.insert", {"table": "orders", "id": 1001,
                             "fields": {"customer_id": "${steps.1.value}"},
                             "references": {"customer_id": "customers"}})
    t.disk("drafts/invoice.txt")
    t.get()
    t.rollback(quiet=True)


def reset_then_abort(t: Transcript) -> None:
    (t.sandbox / "notes.txt").write_text("original")
    t.begin(max_local_depth=0, max_global_resets=1)
    t.step("fs.write", {"path": "notes.txt", "contents": "draft 1"}, "wrote notes")
    t.step("kv.put", {"key": "status", "value": "drafting"}, "status")
    t.step("kv.gett", {"key": "status"})
    t.disk("notes.txt")
    t.get()
    t.step("fs.write", {"path": "notes.txt", "contents": "draft 2"}, "wrote notes again")
    t.step("kv.put", {"key": 42, "value": "drafting"})
    t.disk("notes.txt")
    t.get()


def budget_abort(t: Transcript) -> None:
    t.begin(max_local_depth=0, max_global_resets=3, replay_budget_factor=0.5)
    t.step("kv.put", {"key": "a", "value": 1})
    t.step("kv.put", {"key": "b", "value": 2})
    t.step("kv.put", {"key": "c", "value": 3})
    t.step("no.such.tool", {})


def manual(t: Transcript) -> None:
    t.begin(max_local_depth=0)
    t.step("fs.write", {"path": "report.txt", "contents": "draft"}, "wrote the report")
    t.step("kv.put", {"key": "report", "value": "${steps.1.path}"}, "remembered it")
    report = t.sandbox / "report.txt"
    report.unlink()
    report.mkdir()
    (report / "blocker").write_text("x")
    t.note("someone replaced report.txt by a non-empty directory")
    t.step("kv.gett", {})
    t.call("ExecuteStep", pb.ExecuteStepRequest(transaction_id=t.tx, step_id=2,
                                                tool_name="kv.get", arguments_json="{}"),
           "ExecuteStep(step_id=2, kv.get {})")
    t.call("CommitTransaction", pb.CommitTransactionRequest(transaction_id=t.tx),
           "CommitTransaction")
    t.get()
    t.rollback(to_step=1)
    shutil.rmtree(report)
    t.note("the obstacle is removed")
    t.rollback(to_step=1)
    t.disk("report.txt")
    t.get()
    t.step("fs.write", {"path": "report.txt", "contents": "final"}, "wrote the report")
    t.call("CommitTransaction", pb.CommitTransactionRequest(transaction_id=t.tx),
           "CommitTransaction")
    t.disk("report.txt")


SCENARIOS = [
    ("LOCAL_BACKTRACK, then DEPENDENCY_JUMP to the nearest dependency", local_then_jump),
    ("DEPENDENCY_JUMP to the culprit", culprit_jump),
    ("GLOBAL_RESET, then ABORT", reset_then_abort),
    ("ABORT: replay budget", budget_abort),
    ("MANUAL", manual),
]


def main() -> int:
    root = pathlib.Path(tempfile.mkdtemp(prefix="agenttx-transcripts-"))
    sandbox = root / "sandbox"
    try:
        with serve(fs_root=sandbox, workdir=root,
                   env={"AGENTTX_EXAMPLE_TICKETS_DIR": str(sandbox / "tickets")}) as svc:
            stub = svc.process.stub
            # committed data the scenarios start from
            setup = Transcript(stub, sandbox)
            setup.begin()
            setup.step("kv.put", {"key": "customer-of-the-day", "value": "c-404"})
            stub.CommitTransaction(pb.CommitTransactionRequest(transaction_id=setup.tx))
            for title, scenario in SCENARIOS:
                t = Transcript(stub, sandbox)
                scenario(t)
                print(f"### {title}\n\n```text")
                print("\n".join(t.lines))
                print("```\n")
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
