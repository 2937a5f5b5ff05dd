"""The fault injector: applies a task's scheduled faults to the calls an agent makes.

Why it sits between the agent and the system: the agent must not know the schedule (it
acts only on what the system answers), yet each fault must hit one exact planned call
and be observable by the system as a real error. So every tool call goes through
`Injector.call(op_index, args_text, send, target)`: at the first attempt of a scheduled
op it prepares the fault (garbles or mistypes what the agent emitted, deletes a file,
starts a contending agent, arms the receiver, kills the replica), lets the call go to
the system, and afterwards finishes the fault (the contender abandons its draft, the
concurrent writer commits its change).

The same `Injector` drives every system; only the `FaultEnv` differs:

* `AgentTxEnv` — real processes: SIGKILL of the replica at the agent's target (restarted
  in the background, so the next kill always leaves a survivor), a contending AgentTx
  transaction holding the file's lock, a concurrent AgentTx transaction committing the
  counter, a file deleted from the service's sandbox directory (as any other process on
  the host could).
* `DirectEnv` — the same actors without transactions: the contender writes the file
  directly and, when it abandons the draft, puts back the bytes it saw (compensation
  without isolation), the concurrent writer reads and writes the counter directly, and
  a killed tool server is a call that fails without being applied (the baselines run
  their tools in-process: there is no server to kill).

What it must never do: tell the agent anything, or fire a fault twice (a redone or
re-sent call is clean).
"""

from __future__ import annotations

import json
import pathlib
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

from agenttx.client import Client, Transaction
from agenttx.testing import Service, ServiceProcess

from .direct import DirectTools, ToolFailure, confine, put_back
from .faults import RECEIVER_FAILURES, Fault, FaultKind, garble, with_wrong_value
from .oracle import ExternalWrite
from .plan import Task
from .receiver import Receiver

T = TypeVar("T")

CONTENDER_DRAFT = "draft by another agent (abandoned)\n"
KILLED = ("UNAVAILABLE: the tool server was killed before it answered; the call was not "
          "applied")


class FaultEnv(Protocol):
    def ready(self) -> None: ...
    def kill(self, target: str | None) -> None: ...
    def begin_contender(self, path: str, target: str | None) -> bool: ...
    def end_contender(self) -> None: ...
    def concurrent_add(self, key: str, delta: int, target: str | None) -> None: ...
    def delete_file(self, path: str) -> None: ...
    def refuse(self, key: str, times: int) -> None: ...


class Injector:
    def __init__(self, task: Task, faults: Mapping[int, Fault], env: FaultEnv) -> None:
        self.task = task
        self.faults = faults
        self.env = env
        self.fired: list[Fault] = []
        self.externals: list[ExternalWrite] = []
        self._tried: set[int] = set()

    def call(self, i: int, args_text: str, send: Callable[[str], T],
             target: str | None = None) -> T:
        """Send the agent's call `args_text` for planned op `i` through `send`."""
        fault = None if i in self._tried else self.faults.get(i)
        self._tried.add(i)
        if fault is None:
            return send(args_text)
        self.fired.append(fault)
        op, kind, env = self.task.ops[i], fault.kind, self.env
        contended = False
        if kind is FaultKind.TRANSIENT:
            args_text = garble(args_text, fault.variant)
        elif kind is FaultKind.WRONG_VALUE:
            assert op.wrong is not None
            args_text = with_wrong_value(args_text, op.wrong)
        elif kind is FaultKind.MISSING_FILE:
            env.delete_file(self.task.file_path(i))
        elif kind is FaultKind.LOCK_CONTENTION:
            contended = env.begin_contender(self.task.file_path(i), target)
        elif kind is FaultKind.RECEIVER_FAILURE:
            env.refuse(json.loads(args_text)["idempotency_key"], RECEIVER_FAILURES)
        elif kind is FaultKind.REPLICA_KILL:
            env.kill(target)
        try:
            result = send(args_text)
        finally:
            if contended:
                env.end_contender()
        if kind is FaultKind.COMMIT_CONFLICT:
            assert op.conflict_delta is not None
            key = json.loads(args_text)["key"]
            env.concurrent_add(key, op.conflict_delta, target)
            self.externals.append(ExternalWrite(key, op.conflict_delta))
        return result

    def fired_kinds(self) -> list[str]:
        return [f.kind.value for f in self.fired]


class AgentTxEnv:
    """Faults against a running two-replica AgentTx service (`agenttx.testing.serve`)."""

    def __init__(self, service: Service, receiver: Receiver) -> None:
        self.service = service
        self.receiver = receiver
        self._restart: threading.Thread | None = None
        self._restart_error: BaseException | None = None
        self._contender: tuple[Client, Transaction] | None = None
        self.kills = 0

    def ready(self) -> None:
        """Wait until a replica killed earlier serves again."""
        if self._restart is not None:
            self._restart.join()
            self._restart = None
        if self._restart_error is not None:
            err, self._restart_error = self._restart_error, None
            raise RuntimeError(f"a killed replica did not come back: {err}") from err

    def _replica(self, target: str | None) -> ServiceProcess:
        for proc in self.service.replicas:
            if proc.target == target:
                return proc
        raise KeyError(f"no replica at {target}")

    def kill(self, target: str | None) -> None:
        self.ready()  # the other replica must be up: the agent moves there
        proc = self._replica(target)
        proc.kill()
        self.kills += 1
        self._restart = threading.Thread(target=self._bring_back, args=(proc,),
                                         name="outcomes-restart", daemon=True)
        self._restart.start()

    def _bring_back(self, proc: ServiceProcess) -> None:
        try:
            proc.start(timeout=60)
        except BaseException as exc:  # reported by ready()
            self._restart_error = exc

    def begin_contender(self, path: str, target: str | None) -> bool:
        client = Client(target or self.service.target)
        tx = client.begin(agent_id="outcomes/contender")
        r = tx.step("fs.write", {"path": path, "contents": CONTENDER_DRAFT})
        if not r.ok:  # it could not take the lock: no contention after all
            tx.rollback(reason="could not write")
            client.close()
            return False
        self._contender = (client, tx)
        return True

    def end_contender(self) -> None:
        if self._contender is not None:
            client, tx = self._contender
            self._contender = None
            tx.rollback(reason="draft abandoned")
            client.close()

    def concurrent_add(self, key: str, delta: int, target: str | None) -> None:
        with Client(target or self.service.target) as client, \
                client.transaction(agent_id="outcomes/writer") as tx:
            got = tx.step("kv.get", {"key": key})
            assert got.ok, got.hint
            put = tx.step("kv.put", {"key": key, "value": got.output["value"] + delta})
            assert put.ok, put.hint

    def delete_file(self, path: str) -> None:
        confine(pathlib.Path(self.service.fs_root), path).unlink(missing_ok=True)

    def refuse(self, key: str, times: int) -> None:
        self.receiver.refuse(key, times)


class DirectEnv:
    """The same faults for the baselines' direct tools."""

    def __init__(self, tools: DirectTools, receiver: Receiver,
                 run: Callable[[Awaitable[Any]], Any]) -> None:
        self.tools = tools
        self.receiver = receiver
        self._run = run
        self._contender: tuple[pathlib.Path, bytes | None] | None = None

    def ready(self) -> None:
        pass

    def kill(self, target: str | None) -> None:
        raise ToolFailure(KILLED)

    def begin_contender(self, path: str, target: str | None) -> bool:
        file = self.tools.file(path)
        prior = file.read_bytes() if file.is_file() else None
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(CONTENDER_DRAFT, encoding="utf-8")
        self._contender = (file, prior)
        return True

    def end_contender(self) -> None:
        if self._contender is not None:
            file, prior = self._contender
            self._contender = None
            put_back(file, prior)  # puts back what it saw, whoever wrote since

    def concurrent_add(self, key: str, delta: int, target: str | None) -> None:
        self._run(self.tools.kv_add(key, delta))

    def delete_file(self, path: str) -> None:
        self.tools.file(path).unlink(missing_ok=True)

    def refuse(self, key: str, times: int) -> None:
        self.receiver.refuse(key, times)
