"""`agenttx tx list | show | rollback` as an operator runs it: a real process against the
real replicas, checked for its exact output and exit codes (docs/client.md: 0 done,
1 rollback incomplete, 2 usage, 3 not found, 4 permission denied, 6 service failed or
unreachable). `show` prints the history: open transactions with their live state, ended
ones as they ended."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid

import pytest

from agenttx.client import Client, TransactionStatus
from agenttx.embedded_etcd import free_port

UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


def tx_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agenttx", "tx", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


@pytest.fixture
def client(replicas):
    with Client(replicas[0].target) as c:
        yield c


@pytest.fixture
def target(replicas) -> str:
    return replicas[1].target  # the CLI talks to the other replica: state is in etcd


def test_list_prints_a_table_with_full_ids(client, target, uniq):
    prefix = f"cli-{uniq}-"
    first = client.begin(agent_id=f"{prefix}a")
    second = client.begin(agent_id=f"{prefix}b")
    second.step("kv.put", {"key": f"k-{uniq}", "value": 1})
    second.step("kv.put", {"key": f"k2-{uniq}", "value": 2})
    run = tx_cli("list", "--agent-prefix", prefix, "--target", target)
    assert (run.returncode, run.stderr) == (0, "")
    lines = run.stdout.splitlines()
    assert re.fullmatch(r"TRANSACTION +PRINCIPAL +AGENT +STATUS +NEXT +AGE", lines[0])
    assert len(lines) == 3
    assert re.fullmatch(rf"{first.id} +- +{prefix}a +ACTIVE +1 +\d+s", lines[1])
    assert re.fullmatch(rf"{second.id} +- +{prefix}b +ACTIVE +3 +\d+s", lines[2])
    first.rollback()
    second.rollback()


def test_list_json_pages_with_progress_on_stderr(client, target, uniq):
    prefix = f"page-{uniq}-"
    txs = [client.begin(agent_id=f"{prefix}{i}") for i in range(5)]
    run = tx_cli("list", "--json", "--page-size", "2", "--agent-prefix", prefix,
                 env={"AGENTTX_TARGET": target})
    assert run.returncode == 0, run.stderr
    rows = json.loads(run.stdout)
    assert [r["transaction_id"] for r in rows] == [t.id for t in txs]  # oldest first
    for i, row in enumerate(rows):
        assert set(row) == {"transaction_id", "status", "agent_id", "principal",
                            "next_step_id", "age_s"}
        assert (row["status"], row["agent_id"], row["principal"], row["next_step_id"]) == \
            ("ACTIVE", f"{prefix}{i}", "", 1)
        assert isinstance(row["age_s"], float) and 0 <= row["age_s"] < 120
    progress = run.stderr.splitlines()
    assert progress == [
        "agenttx tx list: 2 transactions so far, reading the next page…",
        "agenttx tx list: 4 transactions so far, reading the next page…",
    ]
    for t in txs:
        t.rollback()


def test_list_with_nothing_open(target, uniq):
    run = tx_cli("list", "--agent-prefix", f"nobody-{uniq}", "--target", target)
    assert (run.returncode, run.stdout, run.stderr) == (0, "no open transactions\n", "")
    run = tx_cli("list", "--json", "--agent-prefix", f"nobody-{uniq}", "--target", target)
    assert (run.returncode, json.loads(run.stdout)) == (0, [])


def test_show_prints_status_next_step_constraints_context_and_every_step_sent(client, target,
                                                                              uniq):
    tx = client.begin(agent_id=f"show-{uniq}")
    tx.step("kv.put", {"key": f"a-{uniq}", "value": 1}, context="remembered a")
    tx.step("fs.write", {"path": f"show-{uniq}.txt", "contents": "x"}, context="wrote\nfile")
    failed = tx.step("kv.get", {"key": f"missing-{uniq}"})
    run = tx_cli("show", tx.id, "--target", target)
    assert (run.returncode, run.stderr) == (0, "")
    lines = run.stdout.splitlines()
    when = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(\d+s ago\)"
    assert re.fullmatch(rf"created        {when}", lines.pop(4)), run.stdout
    assert re.fullmatch(rf"updated        {when}", lines.pop(6)), run.stdout
    at = r"\d\d:\d\d:\d\d"
    table = lines[12:]
    assert lines[:12] == [
        f"transaction    {tx.id}",
        "status         ACTIVE",
        f"agent          show-{uniq}",
        "principal      -",
        "next step      3",
        "global resets  0",
        "constraints",
        f"  - {failed.hint}",
        "context",
        "  step 1    kv.put    remembered a",
        "  step 2    fs.write  wrote file",
        "steps",
    ]
    assert re.fullmatch(r"  STEP  TOOL +STATUS +STRATEGY +AT +ARGUMENTS +RESULT", table[0])
    assert re.fullmatch(rf"  1 +kv\.put +SUCCESS +NONE +{at}  "
                        rf'\{{"key":"a-{uniq}","value":1\}} +'
                        rf'\{{"key":"a-{uniq}","value":1\}}', table[1]), table[1]
    assert re.fullmatch(rf"  2 +fs\.write +SUCCESS +NONE +{at} .*"
                        rf'\{{"path":"show-{uniq}\.txt","bytes":1\}}', table[2]), table[2]
    assert re.fullmatch(rf"  3 +kv\.get +ROLLBACK_TRIGGERED +LOCAL_BACKTRACK +{at} +"
                        rf'\{{"key":"missing-{uniq}"\}} +no_data_found: '
                        rf"{re.escape(failed.hint)}", table[3]), table[3]
    assert len(table) == 4
    as_json = json.loads(tx_cli("show", tx.id, "--json", "--target", target).stdout)
    assert as_json["next_step_id"] == 3 and as_json["constraints"] == [failed.hint]
    assert as_json["context"][1] == {"step_id": 2, "tool_name": "fs.write",
                                     "raw_context": "wrote\nfile"}
    assert [(s["step_id"], s["tool"], s["status"], s["strategy"]) for s in as_json["steps"]] \
        == [(1, "kv.put", "SUCCESS", "NONE"), (2, "fs.write", "SUCCESS", "NONE"),
            (3, "kv.get", "ROLLBACK_TRIGGERED", "LOCAL_BACKTRACK")]
    assert (as_json["status"], as_json["ended_at"], as_json["ended_by"]) == ("ACTIVE", 0.0, "")
    tx.rollback()


def test_show_prints_how_an_ended_transaction_ended(client, target, uniq):
    tx = client.begin(agent_id=f"ended-{uniq}")
    tx.step("kv.put", {"key": f"e-{uniq}", "value": 1})
    tx.step("effect.stage", {"channel": "log", "payload": {"n": 1}})
    tx.commit()
    run = tx_cli("show", tx.id, "--target", target)
    assert (run.returncode, run.stderr) == (0, "")
    lines = run.stdout.splitlines()
    assert lines[:4] == [f"transaction    {tx.id}", "status         COMMITTED",
                         f"agent          ended-{uniq}", "principal      -"]
    assert re.fullmatch(r"ended          .* UTC \(\d+s ago\) by -", lines[5])
    assert lines[6:8] == ["committed      2 steps, 1 effect", "steps"]
    assert [line.split()[:4] for line in lines[9:]] == [
        ["1", "kv.put", "SUCCESS", "NONE"], ["2", "effect.stage", "SUCCESS", "NONE"]]
    rolled = client.begin()
    rolled.step("kv.put", {"key": f"r-{uniq}", "value": 1})
    rolled.rollback(reason="not needed after all")
    as_json = json.loads(tx_cli("show", rolled.id, "--json", "--target", target).stdout)
    assert (as_json["status"], as_json["reason"], as_json["steps_committed"]) == \
        ("ABORTED", "not needed after all", 0)
    assert "next_step_id" not in as_json  # no live state: it ended


def test_show_and_rollback_of_an_unknown_transaction_exit_3(target):
    unknown = str(uuid.uuid4())
    for args in (("show", unknown), ("rollback", unknown)):
        run = tx_cli(*args, "--target", target)
        assert run.returncode == 3, run
        assert run.stdout == "" and unknown in run.stderr and "not found" in run.stderr


def test_rollback_to_a_step_and_abort(client, target, sandbox, uniq):
    tx = client.begin()
    tx.step("kv.put", {"key": f"keep-{uniq}", "value": 1})
    tx.step("fs.write", {"path": f"rb-{uniq}.txt", "contents": "undo me"})
    assert (sandbox / f"rb-{uniq}.txt").exists()
    run = tx_cli("rollback", tx.id, "--to-step", "2", "--target", target)
    assert (run.returncode, run.stderr) == (0, "")
    assert run.stdout == f"rolled back transaction {tx.id} to before step 2: 1 undo action; " \
                         "next step 2\n"
    assert not (sandbox / f"rb-{uniq}.txt").exists()
    assert client.get(tx.id).next_step_id == 2

    run = tx_cli("rollback", tx.id, "--to-step", "9", "--target", target)
    assert run.returncode == 2 and "out of range" in run.stderr

    for bad in ("-1", "two", "1.5"):
        run = tx_cli("rollback", tx.id, "--to-step", bad, "--target", target)
        assert (run.returncode, run.stdout, run.stderr) == (
            2, "", f"agenttx tx rollback: --to-step must be an integer >= 1 (or 0 to abort), "
                   f"not '{bad}'\n")
    assert client.get(tx.id).next_step_id == 2  # nothing changed

    run = tx_cli("rollback", tx.id, "--to-step", "0", "--target", target)
    assert (run.returncode, run.stdout) == (0, f"aborted transaction {tx.id}: 1 undo action\n")
    shown = tx_cli("show", tx.id, "--target", target)
    assert shown.returncode == 0 and "status         ABORTED" in shown.stdout


def test_a_transaction_awaiting_rollback_is_resolved_from_the_cli(client, target, sandbox, uniq):
    tx = client.begin(agent_id=f"stuck-{uniq}")
    tx.step("kv.put", {"key": f"k-{uniq}", "value": 1})
    tx.step("fs.write", {"path": f"stuck-{uniq}", "contents": "created by the step"})
    blocker = sandbox / f"stuck-{uniq}"
    blocker.unlink()
    blocker.mkdir()
    (blocker / "inside.txt").write_text("x")  # the undo cannot delete a full directory
    assert tx.rollback(to_step=1).rolled_back is False
    assert client.get(tx.id).status == TransactionStatus.AWAITING_ROLLBACK

    run = tx_cli("list", "--status", "awaiting_rollback", "--json", "--target", target)
    assert [r["transaction_id"] for r in json.loads(run.stdout)
            if r["agent_id"] == f"stuck-{uniq}"] == [tx.id]
    shown = tx_cli("show", tx.id, "--target", target).stdout
    assert "status         AWAITING_ROLLBACK" in shown and f"agenttx tx rollback {tx.id}" in shown

    run = tx_cli("rollback", tx.id, "--target", target)
    assert run.returncode == 1 and run.stdout == ""
    assert f"rollback of {tx.id} is incomplete" in run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("  - ")]
    assert len(errors) == 1 and f"stuck-{uniq}" in errors[0]

    (blocker / "inside.txt").unlink()
    blocker.rmdir()
    run = tx_cli("rollback", tx.id, "--target", target)
    assert (run.returncode, run.stdout) == (0, f"aborted transaction {tx.id}: 2 undo actions\n")
    assert not blocker.exists()
    assert tx_cli("rollback", tx.id, "--target", target).returncode == 3  # nothing left


@pytest.mark.parametrize(("args", "message"), [
    (("list", "--page-size", "0"), "--page-size must be at least 1"),
    (("list", "--status", "committed"), "invalid choice"),
    (("frobnicate",), "invalid choice"),
    (("show",), "the following arguments are required: ID"),
    (("list", "--tls-cert", "/nonexistent.pem"), "needs both cert= and key="),
])
def test_usage_errors_exit_2(args, message):
    run = tx_cli(*args)
    assert run.returncode == 2 and message in run.stderr, run


def test_an_unreachable_service_exits_6_naming_the_target():
    target = f"127.0.0.1:{free_port()}"
    run = tx_cli("list", "--target", target)
    assert run.returncode == 6 and "UNAVAILABLE" in run.stderr and target in run.stderr
    assert len(run.stderr.splitlines()) == 1
