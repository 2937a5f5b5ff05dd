"""The examples run as a user runs them (`python examples/<name>.py --target ...`) and say
what the docs say they say. A fresh key prefix on the session etcd keeps their fixed ids
(customer 1, order o-1) from meeting other tests' data."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import uuid

import pytest

from agenttx.testing import ServiceProcess

ROOT = pathlib.Path(__file__).resolve().parents[2]
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


@pytest.fixture(scope="module")
def target(etcd, scratch):
    svc = ServiceProcess("examples", etcd_endpoints=etcd.endpoints,
                         prefix=f"/agenttx-ex-{uuid.uuid4().hex[:6]}",
                         fs_root=scratch / "examples-sandbox", workdir=scratch / "examples").start()
    yield svc.target
    svc.stop()


def run(example: str, target: str) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / example), "--target", target],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_quickstart_runs_again_and_again_and_commits_after_its_recovery(target):
    for _ in range(2):  # fresh ids per run: the second run is no different from the first
        lines = run("quickstart.py", target).splitlines()
        assert re.fullmatch(rf"begin    -> transaction {UUID}, next step 1", lines[0])
        customer = re.fullmatch(
            r'step 1   record\.insert  SUCCESS            NONE             -> '
            r'\{"table":"customers","id":"(ada-[0-9a-f]{6})","fields":\{"name":"Ada"\}\}',
            lines[1]).group(1)
        order = "o-" + customer.removeprefix("ada-")
        assert lines[2] == (
            "step 2   record.insert  ROLLBACK_TRIGGERED LOCAL_BACKTRACK  -> "
            'foreign_key_violation: Field "customer_id" of table "orders" references "ada", '
            'which is not in table "customers"; insert that row first or use an existing id.')
        assert lines[3] == (
            "step 2   record.insert  SUCCESS            NONE             -> "
            f'{{"table":"orders","id":"{order}","fields":{{"customer_id":"{customer}",'
            '"total":42}}')
        assert lines[4] == (f"step 3   fs.write       SUCCESS            NONE             -> "
                            f'{{"path":"receipts/{order}.txt","bytes":{len(order) + 10}}}')
        assert lines[5].startswith("step 4   effect.stage   SUCCESS")
        assert lines[6].startswith("get      -> next step 5, constraints ['Field \"customer_id\"")
        assert lines[7] == "commit   -> committed=True steps=4 effects_dispatched=1"
        assert len(lines) == 8


def test_agent_loop(target):
    out = run("agent_loop.py", target)
    assert "FAIL foreign_key_violation" in out and "-> LOCAL_BACKTRACK, next step 1" in out
    assert "the agent reads the hint and creates customer" in out
    assert out.rstrip().endswith("committed: 4 steps, 1 effect(s) delivered")


def test_mcp_client(target):
    out = run("mcp_client.py", target)
    assert "tools: counter_add" in out or "tools: effect_stage" in out
    assert "kv_get (typo in the key) [isError]\n    Step 2 (kv_get) failed: no_data_found." in out
    assert re.search(rf"agenttx_commit \[ok\]\n    Committed transaction {UUID}: 2 steps, "
                     r"0 effects delivered\.", out)
