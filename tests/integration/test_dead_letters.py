"""Dead letters end to end: two real replicas, a real etcd, a real loopback HTTP receiver
that answers 400, 429, 503 or drops the connection for the keys a test scripts.

What is pinned (docs/operations.md, "Dead letters"): a permanent refusal (HTTP 400) is
attempted exactly once and becomes a dead letter, visible with ListDeadLetters, the CLI
and the gauge; transient failures (429, 503, a dropped connection) are retried until the
receiver accepts and delivered exactly once; RetryDeadLetter delivers a letter once more
with the same Idempotency-Key; DiscardDeadLetter removes it and logs its reason; an
unknown key is NOT_FOUND; a non-admin is PERMISSION_DENIED; nothing is ever delivered
twice; idempotency keys that are not 1-200 printable ASCII characters fail the step.

Deadlines come from the settings given to the replicas: the dispatcher's poll interval
and its backoff (0.5 s doubling), through `slack`. "Never again" is checked after the
dispatcher leader has scanned the outbox several more times (its etcd round trips are
counted in the metrics), not after a fixed sleep.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agenttx.auth import hash_token
from agenttx.client import Client, DeadLetter, FailedPrecondition, NotFound, PermissionDenied
from agenttx.contracts.layout import Keys
from agenttx.embedded_etcd import free_port
from agenttx.testing.receivers import DROP
from agenttx.v1 import agenttx_pb2 as pb
from support.receivers import WebhookReceiver
from support.rpc import expect_error, expect_failure
from support.service import Agent, ServiceProcess
from support.waiting import eventually, slack

POLL_S = 0.2          # --effect-poll-s
CLAIM_S = 2           # --effect-claim-s
BASE_BACKOFF_S = 0.5  # the dispatcher's first backoff cap, doubling per failed attempt


def retried_within(failures: int) -> float:
    """How long `failures` transient failures may delay a delivery on a quiet machine:
    each backoff's cap (full jitter never exceeds it) plus a poll interval, and one claim
    in case the committing replica's claim has to lapse first."""
    return sum(BASE_BACKOFF_S * 2 ** i + POLL_S for i in range(failures)) + CLAIM_S


@dataclass
class Deployment:
    replicas: tuple[ServiceProcess, ServiceProcess]
    metrics: tuple[str, str]
    keys: Keys
    hooks: WebhookReceiver

    def scrape(self) -> list[dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
        out = []
        for url in self.metrics:
            with urllib.request.urlopen(url, timeout=5) as resp:
                text = resp.read().decode()
            out.append({(s.name, tuple(sorted(s.labels.items()))): s.value
                        for f in text_string_to_metric_families(text) for s in f.samples})
        return out

    def dead_letter_gauge(self) -> float:
        """max over the replicas: only the dispatcher leader reports it."""
        return max(s.get(("agenttx_effects_dead_letters", ()), 0.0) for s in self.scrape())

    def outbox_round_trips(self) -> float:
        key = ("agenttx_etcd_requests_total", (("operation", "outbox"),))
        return sum(s.get(key, 0.0) for s in self.scrape())

    def after_more_sweeps(self, sweeps: int = 3) -> None:
        """Wait until the dispatcher leader has scanned the outbox `sweeps` more times
        (each scan is at least two etcd round trips: the outbox page and the dead
        letters' count)."""
        start = self.outbox_round_trips()
        eventually(lambda: self.outbox_round_trips() >= start + 2 * sweeps,
                   slack(sweeps * POLL_S), f"{sweeps} more dispatcher sweeps")


@pytest.fixture(scope="module")
def hooks() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as rx:
        yield rx


@pytest.fixture(scope="module")
def deployment(etcd, scratch, sandbox, hooks) -> Iterator[Deployment]:
    prefix = f"/agenttx-dead-{uuid.uuid4().hex[:6]}"
    channels = {"hooks": {"kind": "webhook", "url": hooks.url, "timeout_s": 2}}
    ports = (free_port(), free_port())
    procs = tuple(ServiceProcess(
        f"dead-{i}", etcd_endpoints=etcd.endpoints, prefix=prefix, fs_root=str(sandbox),
        workdir=scratch / "dead", env={"AGENTTX_EFFECT_CHANNELS": json.dumps(channels)},
        extra_args=["--effect-poll-s", str(POLL_S), "--effect-claim-s", str(CLAIM_S),
                    "--leader-ttl-s", "2", "--metrics-listen", f"127.0.0.1:{ports[i]}"],
    ).start() for i in range(2))
    yield Deployment((procs[0], procs[1]),
                     tuple(f"http://127.0.0.1:{p}/metrics" for p in ports),  # type: ignore[arg-type]
                     Keys(prefix), hooks)
    for p in procs:
        p.stop()


@pytest.fixture
def a(deployment: Deployment) -> Iterator[Client]:
    with deployment.replicas[0].client() as c:
        yield c


@pytest.fixture
def b(deployment: Deployment) -> Iterator[Client]:
    with deployment.replicas[1].client() as c:
        yield c


def effects_cli(*args: str, env: dict[str, str] | None = None
                ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agenttx", "effects", *args],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def commit_effects(replica: ServiceProcess, *keys: str) -> tuple[Agent, pb.CommitTransactionResponse]:
    agent = Agent(replica.stub)
    for key in keys:
        agent.ok("effect.stage", {"channel": "hooks", "payload": {"for": key},
                                  "idempotency_key": key})
    return agent, agent.commit()


def letters_of(client: Client, *keys: str) -> list[DeadLetter]:
    return [d for d in client.dead_letters(page_size=2) if d.idempotency_key in keys]


def dead_of(client: Client, key: str) -> DeadLetter:
    [letter] = letters_of(client, key)
    return letter


# ---- idempotency keys ---------------------------------------------------------------------

def test_idempotency_keys_must_be_1_to_200_printable_ascii_characters(deployment, a):
    rx = deployment.hooks
    agent = Agent(deployment.replicas[0].stub)
    for bad, shown in (("\u202e", r'(string "\u202e")'), (" ", '(string " ")'),
                       ("k" * 201, "(201)")):
        resp = agent.step("effect.stage", {"channel": "hooks", "payload": 1,
                                           "idempotency_key": bad})
        hint = expect_failure(resp, "invalid_parameter_value", 'Argument "idempotency_key"',
                              shown, "1 to 200 printable ASCII characters (! to ~)")
        assert "\u202e" not in hint  # shown escaped, never as the raw character
        assert resp.next_step_id == 1  # nothing staged: step 1 is still next
    longest = "k" * 199 + uuid.uuid4().hex[:1]
    out = agent.ok("effect.stage", {"channel": "hooks", "payload": 2,
                                    "idempotency_key": longest})
    assert out == {"staged": True, "channel": "hooks", "idempotency_key": longest}
    generated = agent.ok("effect.stage", {"channel": "hooks", "payload": 3,
                                          "idempotency_key": ""})["idempotency_key"]
    assert generated.startswith(f"{agent.tx}-2-")
    done = agent.commit()
    assert (done.effects_dispatched, list(done.dispatch_errors)) == (2, [])
    assert rx.answers(longest) == [200] and rx.answers(generated) == [200]


# ---- permanent refusals -------------------------------------------------------------------

async def test_a_400_is_attempted_once_and_becomes_a_dead_letter(deployment, a, b, store):
    rx = deployment.hooks
    eventually(lambda: deployment.dead_letter_gauge() == 0, slack(POLL_S * 5),
               "no dead letters left by earlier tests")
    key = f"refused-{uuid.uuid4().hex[:8]}"
    rx.script(key, 400)
    before = time.time()
    agent, done = commit_effects(deployment.replicas[0], key)
    where = rx.url.rsplit("/", 1)[0]
    assert (done.committed, done.effects_dispatched) == (True, 0)
    assert list(done.dispatch_errors) == [
        f"hooks {key}: {where} answered HTTP 400 Bad Request (refused permanently: moved to "
        "the dead letters)"]

    # the other replica lists it: the letter is in etcd, not in a replica's memory
    letter = dead_of(b, key)
    assert letter == DeadLetter(
        idempotency_key=key, transaction_id=agent.tx, channel="hooks", kind="effect",
        last_error=f"{where} answered HTTP 400 Bad Request", attempts=1,
        dead_at=letter.dead_at, principal="")
    assert before <= letter.dead_at <= time.time()
    run = effects_cli("dead", "--json", "--target", deployment.replicas[1].target)
    assert (run.returncode, run.stderr) == (0, "")
    [row] = [r for r in json.loads(run.stdout) if r["idempotency_key"] == key]
    assert row == {"idempotency_key": key, "principal": "", "transaction_id": agent.tx,
                   "kind": "effect", "channel": "hooks", "attempts": 1,
                   "dead_at": letter.dead_at, "last_error": letter.last_error}

    # in etcd: out of the outbox, in the dead letters, its key reserved with no lease
    keys = deployment.keys
    assert await store.get(keys.outbox(agent.tx, 1)) is None
    stored = await store.get(keys.dead_letter("", key))
    assert stored is not None and json.loads(stored.value)["payload"] == {"for": key}
    reservation = await store.get(keys.effect_key("", key))
    assert reservation is not None and reservation.lease == 0
    assert json.loads(reservation.value) == {"tx": agent.tx, "step": 0, "state": "dead"}

    eventually(lambda: deployment.dead_letter_gauge() == 1, slack(POLL_S * 5),
               "agenttx_effects_dead_letters at 1")
    deployment.after_more_sweeps()
    assert rx.answers(key) == [400]  # one attempt, never retried
    b.discard_dead_letter(key, "test cleanup")


def test_429_503_and_dropped_connections_are_retried_until_the_receiver_accepts(
        deployment, b):
    rx = deployment.hooks
    u = uuid.uuid4().hex[:8]
    scripted = {f"busy-{u}": 429, f"down-{u}": 503, f"dropped-{u}": DROP}
    for key, answer in scripted.items():
        rx.script(key, answer, answer)
    _, done = commit_effects(deployment.replicas[0], *scripted)
    assert (done.committed, done.effects_dispatched) == (True, 0)
    errors = sorted(done.dispatch_errors)
    assert errors[0].startswith(f"hooks busy-{u}: ") and "HTTP 429 Too Many Requests" in errors[0]
    assert errors[1].startswith(f"hooks down-{u}: ") and "HTTP 503 Service Unavailable" in errors[1]
    assert errors[2].startswith(f"hooks dropped-{u}: ") and "dropped the connection" in errors[2]
    assert not any("dead letters" in e for e in errors)

    for key, answer in scripted.items():
        eventually(lambda key=key, answer=answer: rx.answers(key) == [answer, answer, 200],
                   slack(retried_within(3)), f"{key} retried until delivered")
    deployment.after_more_sweeps()
    for key, answer in scripted.items():
        assert rx.answers(key) == [answer, answer, 200]  # delivered exactly once
    assert letters_of(b, *scripted) == []


# ---- resolving dead letters ---------------------------------------------------------------

async def test_retrying_a_dead_letter_delivers_it_once_with_the_same_key(deployment, a, b,
                                                                       store):
    rx = deployment.hooks
    key = f"again-{uuid.uuid4().hex[:8]}"
    rx.script(key, 400)  # refused once; afterwards the receiver accepts
    agent, _ = commit_effects(deployment.replicas[0], key)
    assert dead_of(a, key).attempts == 1

    b.retry_dead_letter(key, reason="receiver fixed")
    eventually(lambda: rx.answers(key) == [400, 200], slack(retried_within(1)),
               "the retried letter delivered")
    sent = [r for r in rx.requests if r["headers"]["Idempotency-Key"] == key]
    assert sent[0]["body"] == sent[1]["body"]
    assert json.loads(sent[1]["body"]) == {"channel": "hooks", "payload": {"for": key},
                                           "idempotency_key": key,
                                           "transaction_id": agent.tx}
    assert letters_of(a, key) == []
    with pytest.raises(NotFound, match=f'no dead letter with idempotency key "{key}"'):
        a.retry_dead_letter(key)
    # the key is still reserved (for the retention window): it cannot be staged again
    again = Agent(deployment.replicas[1].stub)
    expect_failure(again.step("effect.stage", {"channel": "hooks", "idempotency_key": key}),
                   "unique_violation", key)
    again.rollback()
    reservation = await store.get(deployment.keys.effect_key("", key))
    assert reservation is not None and reservation.lease != 0
    audit = [r for r in deployment.replicas[1].logs() if r.get("rpc") == "RetryDeadLetter"
             and r.get("idempotency_key") == key]
    assert [(r["code"], r["audit"], r["reason"], r["tx"]) for r in audit] == [
        ("OK", True, "receiver fixed", agent.tx)]
    deployment.after_more_sweeps()
    assert rx.answers(key) == [400, 200]


async def test_discarding_a_dead_letter_removes_it_and_logs_the_reason(deployment, a, store):
    rx = deployment.hooks
    key = f"dropped-for-good-{uuid.uuid4().hex[:8]}"
    rx.script(key, 422)
    agent, _ = commit_effects(deployment.replicas[1], key)
    assert dead_of(a, key).last_error.endswith("answered HTTP 422 Unprocessable Entity")

    target = deployment.replicas[0].target
    run = effects_cli("discard", key, "--reason", "order was cancelled by hand",
                      "--target", target)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"dead letter {key} discarded at ")
    assert letters_of(a, key) == []
    assert await store.get(deployment.keys.dead_letter("", key)) is None
    [line] = [r for r in deployment.replicas[0].logs() if r.get("rpc") == "DiscardDeadLetter"
              and r.get("idempotency_key") == key]
    assert (line["code"], line["audit"], line["reason"], line["tx"], line["channel"]) == (
        "OK", True, "order was cancelled by hand", agent.tx, "hooks")
    # like a delivered effect: the key stays reserved for the retention window
    reservation = await store.get(deployment.keys.effect_key("", key))
    assert reservation is not None and reservation.lease != 0
    assert json.loads(reservation.value)["state"] == "discarded"
    with pytest.raises(NotFound, match=f'no dead letter with idempotency key "{key}"'):
        a.discard_dead_letter(key, "twice")
    deployment.after_more_sweeps()
    assert rx.answers(key) == [422]


def test_unknown_or_malformed_dead_letter_requests(deployment):
    stub = deployment.replicas[0].stub
    nope = f"nope-{uuid.uuid4().hex[:6]}"
    for method in (stub.RetryDeadLetter, stub.DiscardDeadLetter):
        expect_error(method, pb.DeadLetterRequest(idempotency_key=nope, reason="r"),
                     grpc.StatusCode.NOT_FOUND, f'no dead letter with idempotency key "{nope}"')
        expect_error(method, pb.DeadLetterRequest(reason="r"),
                     grpc.StatusCode.INVALID_ARGUMENT, "idempotency_key is required")
    expect_error(stub.DiscardDeadLetter, pb.DeadLetterRequest(idempotency_key=nope),
                 grpc.StatusCode.INVALID_ARGUMENT, "reason is required")
    expect_error(stub.ListDeadLetters, pb.ListDeadLettersRequest(page_token="../../txh/x"),
                 grpc.StatusCode.INVALID_ARGUMENT, "page_token is not a token")
    target = deployment.replicas[0].target
    run = effects_cli("retry", nope, "--target", target)
    assert (run.returncode, run.stdout) == (3, "")
    assert run.stderr == f'agenttx effects retry: no dead letter with idempotency key "{nope}"\n'
    run = effects_cli("discard", nope, "--target", target)  # no --reason: usage, one line
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr == ("agenttx effects discard: the following arguments are required: "
                          "--reason\n")


def test_listing_pages_through_every_dead_letter_in_key_order(deployment, a):
    rx = deployment.hooks
    u = uuid.uuid4().hex[:6]
    keys = [f"page-{u}-{i}" for i in range(5)]
    for key in keys:
        rx.script(key, 404)
    commit_effects(deployment.replicas[0], *keys)
    first = a.dead_letters_page(page_size=2)
    assert len(first.dead_letters) == 2 and first.next_page_token
    seen = [d.idempotency_key for d in a.dead_letters(page_size=2) if d.idempotency_key in keys]
    assert seen == keys  # principal, then key order; each once
    run = effects_cli("dead", "--page-size", "1", "--target", deployment.replicas[1].target)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].split() == ["IDEMPOTENCY", "KEY", "PRINCIPAL", "KIND", "CHANNEL",
                                "ATTEMPTS", "DEAD", "FOR", "TRANSACTION", "LAST", "ERROR"]
    mine = [line.split()[:5] for line in lines[1:] if line.startswith(f"page-{u}-")]
    assert mine == [[k, "-", "effect", "hooks", "1"] for k in keys]
    for key in keys:
        a.discard_dead_letter(key, "test cleanup")


async def test_the_async_client_lists_retries_and_discards_like_the_blocking_one(deployment):
    rx = deployment.hooks
    u = uuid.uuid4().hex[:6]
    again, drop = f"async-again-{u}", f"async-drop-{u}"
    rx.script(again, 410)
    rx.script(drop, 410)
    agent, _ = commit_effects(deployment.replicas[1], again, drop)
    async with deployment.replicas[0].async_client() as client:
        mine = [d async for d in client.dead_letters(page_size=1)
                if d.idempotency_key in (again, drop)]
        assert [(d.idempotency_key, d.transaction_id, d.attempts) for d in mine] == [
            (again, agent.tx, 1), (drop, agent.tx, 1)]
        page = await client.dead_letters_page(page_size=1)
        assert len(page.dead_letters) == 1 and page.next_page_token
        await client.retry_dead_letter(again)
        await client.discard_dead_letter(drop, "async cleanup")
        with pytest.raises(NotFound):
            await client.discard_dead_letter(drop, "twice")
        remaining = [d async for d in client.dead_letters() if d.idempotency_key in (again, drop)]
        assert remaining == []
    eventually(lambda: rx.answers(again) == [410, 200], slack(retried_within(1)),
               "the retried letter delivered")
    assert rx.answers(drop) == [410]


# ---- who may ----------------------------------------------------------------------------

TOKENS = {"alice-t0ken": ("alice", "team-a", ["agent"]),
          "bob-t0ken": ("bob", "team-b", ["agent"]),
          "root-t0ken": ("ops", "agenttx-system", ["admin"])}


@pytest.fixture(scope="module")
def with_tokens(etcd, scratch, sandbox, hooks) -> Iterator[ServiceProcess]:
    path = pathlib.Path(scratch) / f"dead-tokens-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps({"tokens": [
        {"sha256": hash_token(t), "principal": p, "namespace": ns, "roles": r}
        for t, (p, ns, r) in TOKENS.items()]}))
    channels = {"hooks": {"kind": "webhook", "url": hooks.url, "timeout_s": 2}}
    proc = ServiceProcess(
        "dead-auth", etcd_endpoints=etcd.endpoints,
        prefix=f"/agenttx-dead-auth-{uuid.uuid4().hex[:6]}", fs_root=str(sandbox),
        workdir=scratch / "dead-auth", env={"AGENTTX_EFFECT_CHANNELS": json.dumps(channels)},
        extra_args=["--auth", "token", "--auth-tokens-file", str(path),
                    "--effect-poll-s", str(POLL_S), "--effect-claim-s", str(CLAIM_S),
                    "--leader-ttl-s", "2"]).start()
    yield proc
    proc.stop()


def test_dead_letters_are_for_admins_and_keep_their_principal(with_tokens, hooks):
    key = f"shared-{uuid.uuid4().hex[:6]}"
    hooks.script(key, 400, 400)
    for token in ("alice-t0ken", "bob-t0ken"):  # keys are unique per principal
        with with_tokens.client(token=token) as agent_client:
            tx = agent_client.begin(agent_id="billing")
            assert tx.step("effect.stage", {"channel": "hooks", "idempotency_key": key}).ok
            assert tx.commit().effects_dispatched == 0
    with with_tokens.client(token="alice-t0ken") as alice:
        for call in (lambda: alice.dead_letters_page(),
                     lambda: alice.retry_dead_letter(key),
                     lambda: alice.discard_dead_letter(key, "mine")):
            with pytest.raises(PermissionDenied, match="needs the admin role"):
                call()
    run = effects_cli("dead", "--target", with_tokens.target, env={"AGENTTX_TOKEN": "bob-t0ken"})
    assert (run.returncode, run.stdout) == (4, "")
    assert run.stderr.startswith("agenttx effects dead: PERMISSION_DENIED: ListDeadLetters "
                                 "needs the admin role")

    with with_tokens.client(token="root-t0ken") as admin:
        mine = sorted((d.principal, d.idempotency_key) for d in admin.dead_letters()
                      if d.idempotency_key == key)
        assert mine == [("alice", key), ("bob", key)]
        with pytest.raises(FailedPrecondition, match='several principals \\("alice", "bob"\\); pass '
                                            "principal"):
            admin.retry_dead_letter(key)
        admin.retry_dead_letter(key, principal="alice")
        eventually(lambda: hooks.answers(key) == [400, 400, 200],
                   slack(retried_within(1)), "alice's letter delivered")
        run = effects_cli("discard", key, "--reason", "bob's duplicate", "--target",
                          with_tokens.target, env={"AGENTTX_TOKEN": "root-t0ken"})
        assert run.returncode == 0, run.stderr
        assert [d for d in admin.dead_letters() if d.idempotency_key == key] == []
