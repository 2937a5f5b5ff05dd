"""Example AgentTx custom tools, one per rollback kind that touches state.

- `ticket.create` (SAGA): changes the outside world at step time, hands the engine a
  compensation, and undoes itself in `compensate` when the step is rolled back.
- `counter.add` (JOURNAL): reads and writes through the step context; the engine buffers
  the write and simply drops it on rollback.
- `notify.team` (EFFECT): stages a message that is sent only after commit.

Each raises errors worded like PostgreSQL or serde so the AgentTx error cleaner gives the
agent the same hints it gives for the built-ins. They are registered in this package's
pyproject.toml under the `agenttx.tools` entry-point group; see docs/tools.md.
"""

from .counters import AddToCounter
from .notify import NotifyTeam
from .tickets import CreateTicket

__all__ = ["AddToCounter", "CreateTicket", "NotifyTeam"]
