"""Run the suite: every task, on every system, fault-free and at each fault rate, in one run.

Why one process drives it all: the three systems must see the same tasks, the same
faults and the same machine at the same time. One real etcd and one two-replica
`agenttx serve` deployment are started (`agenttx.testing.serve`); the baselines' own
tools (`direct`) keep their data in the same etcd under a prefix of their own. Runs are
interleaved task by task (for each rate, for each task: agenttx, naive_retry, restart),
so drift in machine load hits all three alike.

One run: a fresh namespace; the task's initial state written (AgentTx: one setup
transaction; baselines: directly), the agent run through the injector (wall time taken
around this part only), AgentTx's effects settled (a condition wait on the receiver:
every effect the committed transaction staged, and every refused one, confirmed —
redeliveries after a receiver failure are part of the outcome), the final state read
back (`dump`: AgentTx through its client) and judged.

What it must never do: reuse a namespace, leave a process running after `Bench` exits,
or wait for time instead of a condition.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import pathlib
import shutil
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from agenttx.client import Client
from agenttx.testing import Service, scratch_dir, serve

from . import oracle, tasks
from .agents import AgentRun, AgentTxAgent, NaiveRetryAgent, RestartAgent
from .direct import DirectTools
from .dump import items_of, read_agenttx
from .faults import Fault, FaultSchedule
from .inject import AgentTxEnv, DirectEnv, FaultEnv, Injector
from .receiver import Receiver
from .records import SYSTEMS, BenchRun, RunRecord
from .state import State

T = TypeVar("T")

AGENTTX_PREFIX = "/agenttx"
DIRECT_PREFIX = "/outcomes-direct"
# Service settings for the benchmark's deployment (all ordinary `agenttx serve` flags):
# a dispatcher that scans often and fails over quickly, so redelivery after a receiver
# failure or a kill is measured in seconds rather than the production defaults' tens.
SERVE_ARGS = ("--leader-ttl-s", "2", "--effect-poll-s", "0.2", "--tx-idle-timeout-s", "120")
SETTLE_TIMEOUT_S = 60.0


class Bench:
    """The deployment and the systems under test; use as a context manager."""

    def __init__(self, progress: Callable[[str], None] | None = None) -> None:
        self._progress = progress or (lambda _text: None)
        self._stack = contextlib.ExitStack()
        self._n = 0

    # ---- set-up / tear-down --------------------------------------------------------------

    def __enter__(self) -> Bench:
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def _start(self) -> None:
        self.workdir = scratch_dir("agenttx-outcomes-")
        self._stack.callback(_rmtree, self.workdir)
        self.receiver = self._stack.enter_context(Receiver())
        channels = {"webhook": {"kind": "webhook", "url": self.receiver.url}}
        self._progress("starting etcd and two agenttx replicas")
        self.service: Service = self._stack.enter_context(serve(
            replicas=2, env={"AGENTTX_EFFECT_CHANNELS": json.dumps(channels)},
            extra_args=list(SERVE_ARGS), workdir=self.workdir, prefix=AGENTTX_PREFIX))
        self.loop = asyncio.Runner()
        self._stack.callback(self.loop.close)
        direct_root = self.workdir / "direct-sandbox"
        direct_root.mkdir()
        self.direct = DirectTools(self.service.etcd_endpoints[0], DIRECT_PREFIX, direct_root,
                                  {"webhook": self.receiver.url})
        self._stack.callback(lambda: self.run(self.direct.close()))
        self.agenttx_env = AgentTxEnv(self.service, self.receiver)
        self.direct_env = DirectEnv(self.direct, self.receiver, self.run)
        self.agenttx_agent = AgentTxAgent(self.service.targets)
        self._stack.callback(self.agenttx_agent.close)
        self._stack.callback(self.agenttx_env.ready)  # no restart thread outlives the bench

        def call(tool: str, text: str) -> Any:
            return self.run(self.direct.call(tool, text))
        self.baselines: dict[str, NaiveRetryAgent | RestartAgent] = {
            "naive_retry": NaiveRetryAgent(call), "restart": RestartAgent(call)}

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def run(self, coro: Awaitable[T]) -> T:
        """Run a coroutine on the benchmark's own event loop (etcd reads and writes)."""
        async def wrap() -> T:
            return await coro
        return self.loop.run(wrap())

    # ---- one run -------------------------------------------------------------------------

    def _seed_agenttx(self, task: tasks.Task) -> None:
        """The initial state, committed in one setup transaction through the service."""
        self.agenttx_env.ready()
        init = task.initial
        with Client(self.agenttx_agent.target) as client, \
                client.transaction(agent_id="outcomes/setup") as tx:
            calls = [("kv.put", {"key": k, "value": v}) for k, v in init.kv.items()]
            calls += [("record.insert", {"table": t, "id": i, "fields": f})
                      for (t, i), f in init.rows.items()]
            calls += [("fs.write", {"path": p, "contents": c}) for p, c in init.files.items()]
            for tool, args in calls:
                r = tx.step(tool, args)
                if not r.ok:
                    raise RuntimeError(f"setup of {task.name}: {tool} failed: {r.hint}")

    def _settle(self, task: tasks.Task, effects: Sequence[str]) -> None:
        """Wait until the receiver confirmed every effect of `effects` (what the committed
        transaction staged) and every key of the run it refused (being redelivered)."""
        missing = self.receiver.settle(task.ns, effects, SETTLE_TIMEOUT_S)
        if missing:
            self._progress(f"{len(missing)} effect(s) not delivered after "
                           f"{SETTLE_TIMEOUT_S:g}s; judging as is")

    def new_task(self, index: int) -> tasks.Task:
        """Task `index` of the suite in a namespace no other run has used."""
        self._n += 1
        return tasks.build(index, f"run{self._n:04d}/")

    def set_up(self, task: tasks.Task, system: str) -> FaultEnv:
        """Write the task's initial state for `system`; the fault environment to use."""
        if system == "agenttx":
            self._seed_agenttx(task)
            return self.agenttx_env
        self.run(self.direct.seed(task.initial))
        return self.direct_env

    def agent(self, system: str) -> AgentTxAgent | NaiveRetryAgent | RestartAgent:
        return self.agenttx_agent if system == "agenttx" else self.baselines[system]

    def read_back(self, task: tasks.Task, system: str, effects: Sequence[str] = ()) -> State:
        """What the run left committed, read as a user would: AgentTx through its client
        once its effects settled (`effects`: the keys its committed transaction staged),
        the baselines from their own storage; effects from the receiver."""
        items = items_of(task)
        if system == "agenttx":
            self.agenttx_env.ready()  # a replica killed during the run serves again
            self._settle(task, effects)
            state = read_agenttx(self.agenttx_agent.client, items)
        else:
            state = self.run(self.direct.read(items))
        state.effects = self.receiver.delivered(task.ns)
        return state

    def run_task(self, index: int, system: str, p: float,
                 faults: dict[int, Fault]) -> RunRecord:
        task = self.new_task(index)
        env = self.set_up(task, system)
        env.ready()
        injector = Injector(task, faults, env)
        resent_before = self.agenttx_agent.resent_steps
        started = time.perf_counter()
        result: AgentRun = self.agent(system).run(task, injector)
        wall = time.perf_counter() - started
        resent = self.agenttx_agent.resent_steps - resent_before if system == "agenttx" else 0
        final = self.read_back(task, system, result.effects)
        verdict = oracle.judge(final, oracle.expect(task, injector.externals), task.ns)
        return RunRecord(task.name, system, p, verdict.outcome.value, verdict.final_sha256,
                         verdict.expected_sha256, result.steps, round(wall, 4),
                         verdict.duplicate_effects, verdict.leaked_effects,
                         injector.fired_kinds(), result.note, resent)


def _rmtree(path: pathlib.Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def progress_to_stderr(text: str) -> None:
    print(f"outcomes: {text}", file=sys.stderr, flush=True)


def run_benchmark(n_tasks: int, ps: Sequence[float], seed: int,
                  progress: Callable[[str], None] | None = None,
                  systems: Sequence[str] = SYSTEMS) -> BenchRun:
    """The whole benchmark: fault-free runs, then every rate in `ps`."""
    show = progress or (lambda _text: None)
    started = time.perf_counter()
    suite = tasks.suite(n_tasks)
    schedules = {p: FaultSchedule(seed, p, suite) for p in ps}
    out = BenchRun(seed, n_tasks, list(ps),
                   scheduled={str(p): s.counts() for p, s in schedules.items()})
    with Bench(show) as bench:
        for p in [0.0, *ps]:
            for i, task in enumerate(suite):
                faults = dict(schedules[p].for_task(task.name)) if p else {}
                line = []
                for system in systems:
                    rec = bench.run_task(i, system, p, faults)
                    (out.fault_free if p == 0.0 else out.runs).append(rec)
                    line.append(f"{system} {rec.outcome} ({rec.steps} steps)")
                label = "fault-free" if p == 0.0 else f"p={p:g}"
                show(f"{label} task {i + 1}/{n_tasks} {task.name} [{len(faults)} faults]: "
                     + ", ".join(line))
        out.replica_kills = bench.agenttx_env.kills
    out.wall_s = round(time.perf_counter() - started, 2)
    return out
