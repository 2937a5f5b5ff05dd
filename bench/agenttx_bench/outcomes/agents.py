"""The scripted agents: one policy per system, each acting only on what its system answers.

Why scripted: a benchmark that compares systems needs the same "model" every time. These
agents behave like a careful model would — they derive values from what they read,
re-emit a call that was rejected, redo the steps a hint says are no longer valid — but
deterministically, within a step budget (`BUDGET_FACTOR` x the plan's length, the same
for every system). A step is one tool call sent, failed or not.

* `AgentTxAgent` runs each task as one transaction through `agenttx.client`. On a failed
  step it reads `category`, `hint`, `strategy`, `next_step_id` and `constraints`:
  recoverable categories (a malformed call, a missing row or file, a lock) are retried
  from `next_step_id`, re-deriving every step from there (a dependency jump has undone
  them); the constraints are the hints it was given, and it refuses to send a value a
  hint says does not exist. A commit `Conflict` means the data changed under it: it
  redoes the task in a new transaction. An ended transaction (ABORT) is begun again. Its
  client is given both replicas: when the one it talks to dies, the client moves to the
  other and re-sends the step itself once a re-read shows the step did not apply (the
  agent sees one call; `Client.resent_steps` counts those re-sends). When the client
  cannot clear a lost answer (`OutcomeUnknown`), the agent re-reads the transaction
  (`attach` -> `next_step_id`) and carries on; a step that applied is undone
  (`rollback(to_step=...)`) and redone, since its output is unknown.
  Unrecoverable failures end in an explicit abort: nothing is left behind.
* `NaiveRetryAgent` applies the same calls directly (no transaction); a failed call is
  re-sent up to `retries` times, then the agent gives up. Nothing is undone.
* `RestartAgent` applies them directly too; on any failure it starts the task over from
  the first call. Nothing is undone.

What they must never do: look at the fault schedule or the injector's state.
"""

from __future__ import annotations

import functools
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from agenttx.client import (
    AgentTxError,
    Client,
    Conflict,
    DeadlineExceeded,
    NotFound,
    OutcomeUnknown,
    Strategy,
    Transaction,
    Unavailable,
)

from .direct import ToolFailure
from .inject import Injector
from .plan import Task, encode, render_agenttx, render_local

BUDGET_FACTOR = 3.0
RETRIES = 3
# Categories whose hint tells the agent what to change (docs/recovery.md): re-emit the call, or
# re-derive the values from `next_step_id` on, or wait for a lock.
RECOVERABLE = frozenset({
    "invalid_parameter_value", "invalid_text_representation", "foreign_key_violation",
    "no_data_found", "undefined_file", "lock_not_available",
})
# The same hint this many times: the agent has no better idea.
MAX_REPEATS = 3
LOCK_BACKOFF_S = 0.02
# Values the hints say do not exist (cleaner templates for FK and missing rows/keys).
_MISSING = re.compile(r'references "([^"]*)", which is not in|Key "([^"]*)" does not exist in')


@dataclass(frozen=True)
class AgentRun:
    steps: int
    finished: bool  # the agent believes it completed the task
    note: str
    # Idempotency keys of the effects a committed AgentTx transaction staged (what the
    # runner waits to see delivered before judging); empty otherwise.
    effects: tuple[str, ...] = ()


def budget(task: Task) -> int:
    return int(BUDGET_FACTOR * len(task.ops))


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def ruled_out(constraints: Sequence[str]) -> set[str]:
    """The values the constraints (hints so far) say are missing."""
    return {a or b for c in constraints for a, b in _MISSING.findall(c)}


class AgentTxAgent:
    system = "agenttx"

    def __init__(self, targets: Sequence[str]) -> None:
        self.client = Client(list(targets))

    @property
    def target(self) -> str:
        """The replica the agent's client talks to now (where a kill hurts)."""
        return self.client.target

    @property
    def resent_steps(self) -> int:
        return self.client.resent_steps

    def close(self) -> None:
        self.client.close()

    def _begin(self, task: Task) -> Transaction:
        # A begin is not re-sent by the client (a lost answer may have opened one); the
        # client has moved to the next replica, so begin there.
        for _ in range(len(self.client.targets)):
            try:
                return self.client.begin(agent_id=f"outcomes/{task.name}")
            except (Unavailable, DeadlineExceeded):
                continue
        return self.client.begin(agent_id=f"outcomes/{task.name}")

    @staticmethod
    def _abort(tx: Transaction, reason: str) -> None:
        try:
            tx.rollback(reason=reason[:200])
        except AgentTxError:
            pass  # already gone

    def _reattach(self, tx: Transaction, pos: int) -> Transaction | None:
        """After an answer the client could not clear: read where the transaction is (the
        client has moved to another replica). None when it no longer exists."""
        for _ in range(len(self.client.targets)):
            try:
                again = self.client.attach(tx.id)
            except NotFound:
                return None
            except (Unavailable, DeadlineExceeded):
                continue
            if again.next_step_id > pos + 1:  # it applied, but its output is lost: redo it
                again.rollback(to_step=pos + 1, reason="answer lost; redoing the step")
            return again
        return None

    def run(self, task: Task, injector: Injector) -> AgentRun:
        limit, steps = budget(task), 0
        step_of = {op.label: k + 1 for k, op in enumerate(task.ops)}  # op k is step k + 1
        repeats: Counter[str] = Counter()
        constraints: Sequence[str] = ()
        outputs: dict[str, Any] = {}
        tx, pos = self._begin(task), 0
        while True:
            if pos == len(task.ops):
                try:
                    tx.commit()
                    staged = tuple(out["idempotency_key"] for label, out in outputs.items()
                                   if task.op(label).tool == "effect.stage")
                    return AgentRun(steps, True, "committed", staged)
                except Conflict:  # another agent changed what this one read: redo it all
                    tx, pos, outputs = self._begin(task), 0, {}
                    continue
                except (OutcomeUnknown, Unavailable, DeadlineExceeded) as exc:
                    return AgentRun(steps, False, f"commit outcome unknown: {exc.details}")
                except AgentTxError as exc:
                    return AgentRun(steps, False, f"commit failed: {exc.details}")
            if steps >= limit:
                self._abort(tx, "step budget exhausted")
                return AgentRun(steps, False, "step budget exhausted")
            op = task.ops[pos]
            args = render_agenttx(op.args, outputs, step_of)
            if ruled_out(constraints) & set(_strings(args)):
                self._abort(tx, "a hint rules out a value the plan needs")
                return AgentRun(steps, False, "a hint rules out a value the plan needs")
            steps += 1
            try:
                r = injector.call(pos, encode(args), functools.partial(
                    tx.step, op.tool, context=f"{task.name} {op.label}"), self.target)
            except (OutcomeUnknown, Unavailable, DeadlineExceeded):
                again = self._reattach(tx, pos)
                if again is None:
                    tx, pos, outputs = self._begin(task), 0, {}
                else:
                    tx, pos = again, again.next_step_id - 1
                    outputs = {k: v for k, v in outputs.items() if task.index_of(k) < pos}
                continue
            except AgentTxError as exc:  # an answer the agent has no plan for: stop cleanly
                self._abort(tx, f"unexpected {exc.code.name}")
                return AgentRun(steps, False, f"{exc.code.name}: {exc.details}")
            constraints = r.constraints
            if r.ok:
                outputs[op.label] = r.output
                pos += 1
                continue
            if r.ended:  # ABORT: the service undid everything; begin again
                tx, pos, outputs = self._begin(task), 0, {}
                continue
            repeats[r.hint] += 1
            if r.strategy is Strategy.MANUAL:
                self._abort(tx, "an undo failed")
                return AgentRun(steps, False, f"undo failed: {'; '.join(r.compensation_errors)}")
            if r.category not in RECOVERABLE or repeats[r.hint] > MAX_REPEATS:
                self._abort(tx, f"cannot recover from {r.category}")
                return AgentRun(steps, False, f"cannot recover from {r.category}: {r.hint}")
            if r.category == "lock_not_available":  # the hint: wait for the holder
                time.sleep(LOCK_BACKOFF_S * repeats[r.hint])
            pos = r.next_step_id - 1
            outputs = {k: v for k, v in outputs.items() if task.index_of(k) < pos}


class NaiveRetryAgent:
    system = "naive_retry"

    def __init__(self, call: Callable[[str, str], Any], retries: int = RETRIES) -> None:
        self._call = call
        self.retries = retries

    def run(self, task: Task, injector: Injector) -> AgentRun:
        limit, steps = budget(task), 0
        outputs: dict[str, Any] = {}
        for i, op in enumerate(task.ops):
            last = ""
            for _ in range(1 + self.retries):
                if steps >= limit:
                    return AgentRun(steps, False, "step budget exhausted")
                steps += 1
                try:
                    outputs[op.label] = injector.call(
                        i, encode(render_local(op.args, outputs)),
                        functools.partial(self._call, op.tool))
                    break
                except ToolFailure as exc:
                    last = str(exc)
            else:
                return AgentRun(steps, False, f"{op.label} failed {1 + self.retries} times: "
                                f"{last[:160]}")
        return AgentRun(steps, True, "done")


class RestartAgent:
    system = "restart"

    def __init__(self, call: Callable[[str, str], Any]) -> None:
        self._call = call

    def run(self, task: Task, injector: Injector) -> AgentRun:
        limit, steps, passes = budget(task), 0, 0
        while True:
            passes += 1
            outputs: dict[str, Any] = {}
            for i, op in enumerate(task.ops):
                if steps >= limit:
                    return AgentRun(steps, False, f"step budget exhausted in pass {passes}")
                steps += 1
                try:
                    outputs[op.label] = injector.call(
                        i, encode(render_local(op.args, outputs)),
                        functools.partial(self._call, op.tool))
                except ToolFailure:
                    break
            else:
                return AgentRun(steps, True, f"done in pass {passes}")
