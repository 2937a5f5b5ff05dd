"""The agent-outcomes benchmark (`agenttx bench outcomes`): does AgentTx make agents finish
their tasks correctly when tools fail, compared with the same agents without it?

A suite of multi-step business tasks (orders with line items, ticket triage, stock moves,
billing, refunds, onboarding; `tasks`), each with a known correct final state, is run by
scripted agents (`agents`) against three systems on the same etcd, with the same seeded
fault schedule (`faults`) applied by the same injector (`inject`):

* ``agenttx``: every task is one AgentTx transaction on a real two-replica service;
* ``naive_retry``: tools of the benchmark's own with the built-ins' behaviour, applied
  directly, no transaction (`direct`), a failed call retried up to k times, nothing
  undone;
* ``restart``: the same direct tools; on any failure the task starts over, nothing undone.

The benchmark is a user of AgentTx, not a part of it: it reaches the service through
`agenttx.client` only, and the baselines share nothing of AgentTx's code or data (only
the etcd server, under a prefix of their own, and the webhook receiver).
After each run the final committed state (kv, records, files — for AgentTx read through
its client — and the effects the webhook receiver confirmed) is read back (`dump`) and
judged by a pure oracle (`oracle`): correct, partial (incomplete, nothing wrong
committed) or corrupt, plus duplicate and leaked effects.
`runner` drives it, `report` aggregates, tabulates and plots, `cli` is the command line.

What it must never do: let an agent see the fault schedule (agents act only on what a
system answers), give one system a fault the others do not get, or judge a run by
anything but the state a user could read afterwards.
"""
