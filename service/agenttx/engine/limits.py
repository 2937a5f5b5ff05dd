"""Size and operation budgets: nothing the service accepted may later fail for size.

SPEC §2 "every answer fits": a step whose output, references, raw_context or writes would
make any response (ExecuteStep, GetTransaction's whole context log) or any etcd request
of the transaction (the step's CAS, the commit, a rollback) exceed what the service and
etcd carry fails *before it applies* with `program_limit_exceeded`, naming the limit.
The checks are pure functions of the transaction's running `Budget` and the step's own
delta, so they cost the same at step 1 and step 500.

Where the numbers come from:
* etcd refuses a Txn with more than `--max-txn-ops` compares, or success, or failure
  operations (server/etcdserver/api/v3rpc/key.go checkTxnRequest), and any request over
  `--max-request-bytes` (embed.Config.MaxRequestBytes). The service is told both
  (`--etcd-max-txn-ops`, `--etcd-max-request-bytes`).
* A gRPC client refuses responses over 4 MiB unless it raised its own limit
  (grpc.max_receive_message_length default, GRPC_DEFAULT_MAX_RECV_MESSAGE_LENGTH), so a
  response never exceeds RESPONSE_BYTES; the server's send and receive limits are set
  to it (server.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..contracts.layout import COMMIT_RESERVED_OPS
from .state import Budget

MIB = 1024 * 1024
# The largest response any AgentTx RPC sends (gRPC's default client receive limit).
RESPONSE_BYTES = 4 * MIB
# Room a response needs besides its payload (field tags, ids, enum values, hints).
RESPONSE_SLACK = 64 * 1024
# Per context-log entry in GetTransaction: step id, tool name and framing.
CONTEXT_ENTRY_OVERHEAD = 160
# Constraints (aggregated hints) are returned by every step and Get: keep them bounded.
MAX_CONSTRAINTS_BYTES = 32 * 1024
# Shares of etcd's --max-request-bytes: one step's CAS, and one commit.
STEP_BYTES_SHARE = 0.6
COMMIT_BYTES_SHARE = 0.75
# Per-key overhead in a commit request: key bytes, framing, the compare.
COMMIT_KEY_OVERHEAD = 160


@dataclass(frozen=True, slots=True)
class Limits:
    max_txn_ops: int
    max_request_bytes: int

    @property
    def step_bytes(self) -> int:
        return int(self.max_request_bytes * STEP_BYTES_SHARE)

    @property
    def commit_bytes(self) -> int:
        return int(self.max_request_bytes * COMMIT_BYTES_SHARE)

    @property
    def response_budget(self) -> int:
        return RESPONSE_BYTES - RESPONSE_SLACK


def context_cost(tool: str, raw_context: str) -> int:
    """What a step's raw_context adds to GetTransaction's response."""
    if not raw_context:
        return 0
    return len(raw_context.encode("utf-8", "surrogatepass")) + len(tool) + CONTEXT_ENTRY_OVERHEAD


def constraints_bytes(constraints: tuple[str, ...] | list[str]) -> int:
    return sum(len(c.encode()) + 4 for c in constraints)


def approval_bytes(budget: Budget) -> int:
    """What a pending approval's record (ListApprovals' entry, written by the commit that
    stops at the gate) needs for this transaction: every gated call and effect the steps
    recorded, and the write set's keys."""
    return budget.gated_bytes + COMMIT_KEY_OVERHEAD * (budget.write_keys + 1)


def check_step(limits: Limits, after: Budget, *, step_compares: int, step_ops: int,
               step_bytes: int, output_bytes: int, constraints: tuple[str, ...],
               approval: bool = False) -> str | None:
    """The program_limit_exceeded message for a step that would not fit, else None.
    `approval`: the transaction may stop at the approval gate, so its approval record
    must fit one etcd write and one ListApprovals answer too."""
    ops = limits.max_txn_ops
    if after.read_keys + 1 > ops:
        return (f"program limit exceeded: the transaction would read or write "
                f"{after.read_keys} distinct keys; one commit validates at most {ops - 1} "
                "(etcd --max-txn-ops)")
    commit_ops = after.write_keys + 2 * after.effects + after.locks + COMMIT_RESERVED_OPS
    if commit_ops > ops:
        return (f"program limit exceeded: the transaction would write {after.write_keys} keys, "
                f"{after.effects} effects and {after.locks} locks; the limit is "
                f"{ops - COMMIT_RESERVED_OPS} operations (etcd --max-txn-ops minus "
                f"{COMMIT_RESERVED_OPS} reserved; an effect costs two)")
    if step_compares > ops or step_ops > ops:
        return (f"program limit exceeded: the step touches {max(step_compares, step_ops)} "
                f"keys; one step writes at most {ops} (etcd --max-txn-ops)")
    if step_bytes > limits.step_bytes:
        return (f"program limit exceeded: the step would store {step_bytes} bytes; the limit "
                f"is {limits.step_bytes} (a share of etcd's --max-request-bytes)")
    commit_bytes = after.write_bytes + 2 * after.effect_bytes + \
        COMMIT_KEY_OVERHEAD * (after.read_keys + after.write_keys + 2 * after.effects)
    if commit_bytes > limits.commit_bytes:
        return (f"program limit exceeded: the transaction's writes would reach {commit_bytes} "
                f"bytes; one commit carries at most {limits.commit_bytes}")
    answer = limits.response_budget - constraints_bytes(constraints)
    if output_bytes > answer:
        return (f"program limit exceeded: the step's output would be {output_bytes} bytes; "
                f"an ExecuteStep response carries at most {answer}")
    if after.context_bytes > answer:
        return (f"program limit exceeded: the transaction's context log would reach "
                f"{after.context_bytes} bytes; a GetTransaction response carries at most "
                f"{answer} (raw_context counts)")
    if approval:
        record = approval_bytes(after)
        most = min(answer, limits.commit_bytes)
        if record > most:
            return (f"program limit exceeded: what this transaction would ask a person to "
                    f"approve would reach {record} bytes; one approval carries at most "
                    f"{most}")
    return None


def add_constraint(constraints: tuple[str, ...], hint: str) -> tuple[str, ...]:
    """Append a distinct hint (SPEC §4), within MAX_CONSTRAINTS_BYTES: once full, new
    hints are still answered in clean_hint but no longer aggregated."""
    if hint in constraints:
        return constraints
    if constraints_bytes(constraints) + len(hint.encode()) + 4 > MAX_CONSTRAINTS_BYTES:
        return constraints
    return (*constraints, hint)
