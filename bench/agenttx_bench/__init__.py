"""AgentTx's benchmarks: `agenttx bench` (cost of a step, a commit, a workflow, as ratios
to baselines measured in the same run) and `agenttx bench outcomes` (agent outcomes with
and without AgentTx under seeded faults).

A benchmark is a user, not a part: it talks to the service through `agenttx.client` and
the gRPC API only (import-linter forbids the rest), so it measures what users get and
cannot break the product's invariants. It ships in the `agenttx` distribution beside the
service, never in the client.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """`agenttx bench [outcomes]` in the one `agenttx` parser (agenttx.cli)."""
    from . import perf
    from .outcomes import cli as outcomes_cli

    # No abbreviations: `agenttx bench outcomes --p 0.3` must reach the subcommand, not be
    # read as a prefix of `--peers` / `--peer-workflows` here.
    parser = subparsers.add_parser(
        "bench", help="benchmark a running or embedded service", allow_abbrev=False,
        description=perf.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    perf.configure(parser)
    parser.set_defaults(func=perf.run)
    sub = parser.add_subparsers(dest="bench_command", metavar="{outcomes,toolsets}")
    outcomes = sub.add_parser(
        "outcomes", help="agent outcomes with and without AgentTx under seeded faults",
        description=outcomes_cli.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    outcomes_cli.configure(outcomes)
    outcomes.set_defaults(func=outcomes_cli.run)
    from . import toolsets
    toolsets_parser = sub.add_parser(
        "toolsets", help="a toolset step's cost beyond its MCP call (docs/toolsets.md)",
        description=toolsets.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    toolsets.configure(toolsets_parser)
    toolsets_parser.set_defaults(func=toolsets.run)
