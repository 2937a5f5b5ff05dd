#!/usr/bin/env python3
"""Time `agenttx.args` on the worst 1 MiB argument documents we can construct.

Why: parsing and reference resolution must be linear in the document
(docs/tools.md#the-built-ins); the old parser took seconds to minutes on some of these shapes
(issue 9). Each row is one document: its shape, its size in bytes, the best of --repeat runs in
milliseconds of CPU time for parse_arguments alone and for parse + find_references + resolve (with step 1
live), and the outcome (`ok` or the start of the serde-style message). CPU time, not wall
time, so that other work on a shared machine does not blur the figures; the call holds
the GIL throughout, so the wall time on an idle core is the same. The figures in
docs/benchmarks.md ("Argument parsing at 1 MiB") come from this script.

    .venv/bin/python scripts/bench_args.py [--size BYTES] [--repeat N]

Pure CPU, no I/O beyond printing; run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from agenttx.args import (
    ArgumentsError,
    ReferenceError_,
    find_references,
    parse_arguments,
    resolve,
)


def _fill(unit: str, size: int, head: str = "", tail: str = "") -> str:
    """head + unit repeated + tail, about `size` characters in all."""
    return head + unit * max(1, (size - len(head) - len(tail)) // len(unit)) + tail


def documents(size: int) -> list[tuple[str, str]]:
    deep = "[" * 126 + "]" * 126  # nests 126 levels: inside {"v":[...]} it reaches 128
    refs = json.dumps({"v": ["${steps.1.value}"] * (size // 20)})
    some_refs = json.dumps({"v": ["${steps.1.value}"] * 5000, "pad": "x" * (size - 100_000)})
    return [
        ("flat object, 100k keys", json.dumps({f"k{i}": i for i in range(100_000)})),
        ("one long string", _fill("x", size, '{"v":"', '"}')),
        ("small objects", _fill('{"a":0},', size, '{"v":[', '{"a":0}]}')),
        ("floats (number hooks on)", _fill("1.5e100,", size, '{"v":[', "0]}")),
        ("deep nesting at the limit (128)", _fill(deep + ",", size, '{"v":[', deep + "]}")),
        ("deep nesting, 129th level at the end",
         _fill(deep + ",", size, '{"v":[', "[" + deep + "]]}")),
        ("unclosed [ x 1M", _fill("[", size)),
        ("127 open levels, then an error", _fill('"k",', size, '{"a":' + "[" * 127, "x")),
        ("stray ] x 1M", _fill("]", size, "{}" * 129)),
        ('1e400 inside a string, then 1e400 (issue 9)', _fill("1e400 ", size, '{"a":"', '","b":1e400}')),
        ('"1e400" strings, then 1e400', _fill('"1e400",', size, '{"v":[', "1e400]}")),
        ("1e400 x N outside strings", _fill("1e400,", size, '{"v":[', "1]}")),
        ("huge integer (1M digits)", _fill("9", size, '{"v":', "}")),
        ("300-digit integers", _fill("9" * 300 + ",", size, '{"v":[', "1]}")),
        ("208-digit integers", _fill("9" * 208 + ",", size, '{"v":[', "1]}")),
        ('\\" x N, unterminated string', _fill('\\"', size, '{"a":"')),
        ('\\" x N, terminated', _fill('\\"', size, '{"a":"', '"}')),
        ("surrogate pairs, lone one at the end", _fill("\\ud83d\\ude00", size, '{"a":"', '\\ud800"}')),
        ("escaped \\\\ud800 text x N", _fill("\\\\ud800", size, '{"a":"', '"}')),
        ("duplicate key first", _fill('"a":0,', size, "{", '"a":0}')),
        ("duplicate key last of 100k", json.dumps({f"k{i}": i for i in range(100_000)})[:-1]
         + ',"k0":1}'),
        ("small objects, duplicate in the last",
         _fill('{"a":0},', size, '{"v":[', '{"a":0,"a":1}]}')),
        ("small objects, syntax error at the end", _fill('{"a":0},', size, '{"v":[', '{"a":0 "b"]}')),
        ("${steps.1.a x N, unterminated", json.dumps({"v": _fill("${steps.1.a", size - 20)})),
        ("${steps.<5000 digits>.x}", json.dumps({"v": "${steps." + "9" * 5000 + ".x}"})),
        ("5k valid references (+ padding)", some_refs),
        ("50k valid references", refs),
    ]


def _outcome(action: Callable[[], Any]) -> str:
    try:
        action()
    except (ArgumentsError, ReferenceError_) as exc:
        return str(exc)[:72]
    return "ok"


def _best(action: Callable[[], Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        try:
            action()
        except (ArgumentsError, ReferenceError_):
            pass
        best = min(best, time.process_time() - start)
    return best * 1000


def _resolve(text: str) -> Callable[[], Any]:
    def run() -> Any:
        args = parse_arguments(text)
        refs = find_references(args)
        steps = {r.step for r in refs if r.step is not None}
        outputs = {s: {"key": "k", "value": "v"} for s in steps if s == 1}
        return resolve(args, outputs, range(1, 2), refs)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1 << 20, help="document size in bytes")
    parser.add_argument("--repeat", type=int, default=5, help="runs per document (best kept)")
    opts = parser.parse_args()
    print(f"{'shape':<42} {'bytes':>9} {'parse ms':>9} {'+refs ms':>9}  outcome")
    for name, text in documents(opts.size):
        parse_ms = _best(lambda t=text: parse_arguments(t), opts.repeat)  # type: ignore[misc]
        both = _resolve(text)
        total_ms = _best(both, opts.repeat)
        size = len(text.encode("utf-8"))
        print(f"{name:<42} {size:>9} {parse_ms:>9.1f} {total_ms:>9.1f}  {_outcome(both)}")


if __name__ == "__main__":
    main()
