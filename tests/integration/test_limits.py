"""etcd's per-transaction limits: a step that would make the commit too big for etcd
fails with program_limit_exceeded, and the write set etcd does accept commits whole."""

from __future__ import annotations

import uuid

import pytest

from agenttx.embedded_etcd import EmbeddedEtcd
from support.service import Agent, ServiceProcess


@pytest.fixture
def small_etcd(scratch):
    """A real etcd with etcd's own defaults for both limits (128 ops, 1.5 MiB)."""
    server = EmbeddedEtcd(scratch / f"etcd-small-{uuid.uuid4().hex[:6]}", max_txn_ops=128,
                          max_request_bytes=1536 * 1024).start()
    yield server
    server.stop()


@pytest.fixture
def small(small_etcd, scratch, sandbox):
    svc = ServiceProcess("limits", etcd_endpoints=small_etcd.endpoints, prefix="/agenttx-lim",
                         fs_root=str(sandbox), workdir=scratch / "limits",
                         extra_args=["--etcd-max-txn-ops", "128",
                                     "--etcd-max-request-bytes", str(1536 * 1024)]).start()
    yield svc
    svc.stop()


def test_write_set_is_bounded_by_max_txn_ops_and_commits_whole(small):
    agent = Agent(small.stub)
    limit = 128 - 8  # keys + effects + locks a commit may carry
    for i in range(limit):
        agent.ok("kv.put", {"key": f"op-{i}", "value": i})
    resp = agent.step("kv.put", {"key": "one-too-many", "value": 0})
    assert resp.error_category == "program_limit_exceeded"
    assert "limit" in resp.clean_hint.lower()
    # rewriting a key already in the write set costs nothing more
    agent.ok("kv.put", {"key": "op-0", "value": "again"})
    done = agent.commit()
    assert done.committed and done.steps_committed == limit + 1
    check = Agent(small.stub)
    assert check.ok("kv.get", {"key": f"op-{limit - 1}"})["value"] == limit - 1
    assert check.ok("kv.get", {"key": "op-0"})["value"] == "again"


def test_large_writes_are_refused_before_etcd_would_refuse_the_commit(small):
    agent = Agent(small.stub)
    blob = "x" * (400 * 1024)
    agent.ok("kv.put", {"key": "big-1", "value": blob})
    agent.ok("kv.put", {"key": "big-2", "value": blob})
    resp = agent.step("kv.put", {"key": "big-3", "value": blob})
    assert resp.error_category == "program_limit_exceeded"
    assert agent.commit().steps_committed == 2  # etcd accepted everything we promised
    assert len(Agent(small.stub).ok("kv.get", {"key": "big-2"})["value"]) == len(blob)


def test_one_step_too_large_for_a_small_etcd_is_a_failed_step_not_internal(small):
    agent = Agent(small.stub)
    resp = agent.step("kv.put", {"key": "huge", "value": "y" * (1000 * 1024)})
    assert resp.error_category == "program_limit_exceeded"
    agent.ok("kv.put", {"key": "small", "value": 1})
    assert agent.commit().committed
