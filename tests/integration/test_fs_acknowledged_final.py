"""An acknowledged fs.write is final (docs/recovery.md, "An acknowledged step is final").

Once ExecuteStep answered SUCCESS for an fs.write, someone else changing, deleting or
replacing the file by a directory must not make the step look interrupted: the next call
on the *other* replica answers normally at once (never FAILED_PRECONDITION "still being
applied", never a silent undo), and a later rollback restores the bytes from before the
step, overwriting the outside change as any compensation does.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable

import grpc
import pytest

from agenttx.v1 import agenttx_pb2 as pb
from support.rpc import expect_error
from support.service import Agent


def _modify(path: pathlib.Path) -> None:
    path.write_text("changed by someone else")


def _delete(path: pathlib.Path) -> None:
    path.unlink()


def _replace_by_directory(path: pathlib.Path) -> None:
    path.unlink()
    path.mkdir()


CHANGES: dict[str, Callable[[pathlib.Path], None]] = {
    "modify": _modify, "delete": _delete, "replace-by-directory": _replace_by_directory}


@pytest.fixture(params=sorted(CHANGES))
def changed(request, a, sandbox, uniq):
    """Step 1 (fs.write over existing bytes) acknowledged on replica A, step 2 too; then
    the file is changed behind the transaction's back."""
    path = sandbox / f"final-{request.param}-{uniq}.txt"
    path.write_text("before")
    agent = Agent(a)
    assert agent.ok("fs.write", {"path": path.name, "contents": "mine"}) == {
        "path": path.name, "bytes": 4}
    assert agent.next == 2
    CHANGES[request.param](path)
    return agent, path


def test_the_next_step_on_the_other_replica_proceeds_at_once(changed, b, uniq):
    agent, _ = changed
    resp = agent.step("kv.put", {"key": f"after-{uniq}", "value": 1}, stub=b)
    assert resp.status == pb.STEP_STATUS_SUCCESS, (resp.error_category, resp.clean_hint)
    assert resp.next_step_id == 3
    view = b.GetTransaction(pb.GetTransactionRequest(transaction_id=agent.tx))
    assert (view.status, view.next_step_id) == (pb.TRANSACTION_STATUS_ACTIVE, 3)


def test_a_rollback_to_the_step_restores_the_bytes_from_before_it(changed, b):
    agent, path = changed
    resp = b.RollbackTransaction(pb.RollbackTransactionRequest(
        transaction_id=agent.tx, to_step=1, reason="test"))
    assert (resp.rolled_back, resp.next_step_id, resp.compensations_run,
            list(resp.compensation_errors)) == (True, 1, 1, [])
    assert path.is_file() and path.read_text() == "before"


def test_an_abort_restores_the_bytes_from_before_the_step(changed, b):
    agent, path = changed
    resp = b.RollbackTransaction(pb.RollbackTransactionRequest(transaction_id=agent.tx))
    assert (resp.rolled_back, resp.next_step_id, resp.compensations_run) == (True, 0, 1)
    assert path.is_file() and path.read_text() == "before"
    expect_error(b.GetTransaction, pb.GetTransactionRequest(transaction_id=agent.tx),
                 grpc.StatusCode.NOT_FOUND, agent.tx)


def test_a_commit_on_the_other_replica_commits_and_leaves_the_file_alone(changed, b, request):
    agent, path = changed
    before = (path.is_dir(), path.read_text() if path.is_file() else None, path.exists())
    resp = b.CommitTransaction(pb.CommitTransactionRequest(transaction_id=agent.tx))
    assert (resp.committed, resp.steps_committed) == (True, 1)
    # the outside change stays as it is: commit never rewrites a file
    assert (path.is_dir(), path.read_text() if path.is_file() else None,
            path.exists()) == before


def test_a_step_created_file_removed_by_someone_else_is_not_recreated(a, b, sandbox, uniq):
    path = sandbox / f"final-created-{uniq}.txt"
    agent = Agent(a)
    agent.ok("fs.write", {"path": path.name, "contents": "new"})
    path.unlink()
    agent.ok("kv.put", {"key": f"k-{uniq}"}, stub=b)
    resp = agent.rollback(to_step=1)
    assert (resp.rolled_back, resp.compensations_run) == (True, 2)
    assert not path.exists()
