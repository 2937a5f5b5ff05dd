"""Named crash points for fault-injection tests (inert unless armed).

`agenttx serve` arms them from its `failpoints` setting (`--failpoints` or
AGENTTX_FAILPOINTS, docs/configuration.md), once, at start-up:

    AGENTTX_FAILPOINTS="fs.write.after_intent=crash,commit.after_txn=crash"

`crash` kills the process on the spot with SIGKILL (no cleanup, no flush: exactly what
a node failure looks like); `sleep(<seconds>)` pauses, to widen race windows. Points:

    fs.write.before_intent   temp file written, step not yet committed to etcd
    fs.write.after_intent    step (with undo image) committed, file not yet renamed
    fs.write.after_rename    file in place, response not yet sent
    undo.after_intent        undo intent committed, files not yet restored
    undo.after_restore       files restored, state not yet committed
    commit.after_txn         commit applied in etcd, effects not yet delivered
    toolset.saga.after_call  a toolset saga call answered, its step not yet recorded
    approval.before_txn      an approval checked (digest, four eyes), its commit not yet sent
    approval.after_txn       an approved commit applied in etcd, effects not yet delivered
"""

from __future__ import annotations

import os
import re
import signal
import time

_SPEC = re.compile(r"^(crash|sleep\((\d+(?:\.\d+)?)\))$")


def parse(text: str) -> dict[str, str]:
    """`name=action,...` as {name: action}; ValueError naming an unknown action."""
    points: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, _, action = item.partition("=")
        action = action.strip() or "crash"
        if not _SPEC.match(action):
            raise ValueError(f"failpoints: unknown action {action!r} for {name!r} "
                             "(crash or sleep(<seconds>))")
        points[name.strip()] = action
    return points


_POINTS: dict[str, str] = {}


def arm(text: str) -> None:
    """Arm exactly the points in `text` (empty: none). Raises ValueError when malformed."""
    global _POINTS
    _POINTS = parse(text)


def hit(name: str) -> None:
    """Called at a named point; does nothing unless that point is armed."""
    if not _POINTS:
        return
    action = _POINTS.get(name)
    if action is None:
        return
    if action == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(10)  # never reached
    m = _SPEC.match(action)
    if m and m.group(2):
        time.sleep(float(m.group(2)))
