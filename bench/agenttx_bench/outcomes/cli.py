"""`agenttx bench outcomes`: task outcomes with AgentTx and without it, under seeded faults.

    agenttx bench outcomes --tasks N --p P [--p P ...] --seed S [--json] [--plot PATH]
                           [--out PATH] [--quiet]

Starts its own etcd and two `agenttx serve` replicas on loopback, runs the suite's first
N tasks fault-free and at every fault rate P on three systems (agenttx, naive_retry,
restart), and prints a table (or, with --json, the report of docs/benchmarks.md) on stdout;
progress goes to stderr. Exit status 0; 1 when a fault-free run did not end correct (the
suite or a system is broken, so the figures mean nothing); 2 for bad flags.

Must never leave a process running: everything it starts is stopped on the way out,
also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from collections.abc import Sequence

DEFAULT_PS = (0.1, 0.3, 0.5)


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"a fault rate is within (0, 1], got {text}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"at least 1, got {text}")
    return value


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tasks", type=_count, default=30,
                   help="how many tasks of the suite (cycled over its six families; default 30)")
    p.add_argument("--p", type=_rate, action="append", dest="ps", metavar="P",
                   help="per-call fault rate; repeat for several (default 0.1 0.3 0.5)")
    p.add_argument("--seed", type=int, default=1, help="fault schedule seed (default 1)")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of a table")
    p.add_argument("--plot", metavar="PATH", help="write the figure as a PNG (needs matplotlib)")
    p.add_argument("--out", metavar="PATH", help="also write the JSON report to PATH")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agenttx bench outcomes", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    configure(p)
    return p


def main(argv: Sequence[str]) -> int:
    return run(parser().parse_args(list(argv)))


def run(ns: argparse.Namespace) -> int:
    from . import report as report_mod
    from .runner import progress_to_stderr, run_benchmark

    ps = list(dict.fromkeys(ns.ps or DEFAULT_PS))
    run = run_benchmark(ns.tasks, ps, ns.seed, None if ns.quiet else progress_to_stderr)
    report = report_mod.summarize(run, ns.plot)
    if ns.plot:
        from .plot import plot

        plot(report, ns.plot)
    if ns.out:
        pathlib.Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(ns.out).write_text(json.dumps(report, indent=2) + "\n")
    if ns.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(report_mod.table(report))
    broken = [f"{r['system']} {r['success']}/{r['tasks']}" for r in report["fault_free"]
              if r["success"] != r["tasks"]]
    if broken:
        print(f"agenttx bench outcomes: fault-free runs not all correct ({', '.join(broken)}); "
              "the figures are not meaningful", file=sys.stderr)
        return 1
    return 0
