"""The agent-outcomes benchmark (`agenttx bench outcomes`): does AgentTx make agents finish
their tasks correctly when tools fail, compared with the same agents without it?

A suite of multi-step business tasks (orders with line items, ticket triage, stock moves,
billing, refunds, onboarding; `tasks`), each with a known correct final state, is run by
scripted agents (`agents`) against three systems on the same etcd, with the same seeded
fault schedule (`faults`) applied by the same injector (`inject`):

* ``agenttx``: every task is one AgentTx transaction on a real two-replica service;
* ``naive_retry``: the same built-in tools applied directly, no transaction (`direct`),
  a failed call retried up to k times, nothing undone;
* ``restart``: the same direct tools; on any failure the task starts over, nothing undone.

After each run the final committed state (kv, records, files, effects the webhook
receiver confirmed) is dumped and judged by a pure oracle (`oracle`): correct, partial
(incomplete, nothing wrong committed) or corrupt, plus duplicate and leaked effects.
`runner` drives it, `report` aggregates, tabulates and plots, `cli` is the command line.

What it must never do: let an agent see the fault schedule (agents act only on what a
system answers), give one system a fault the others do not get, or judge a run by
anything but the state a user could read afterwards.
"""
