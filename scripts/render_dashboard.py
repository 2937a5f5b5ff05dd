#!/usr/bin/env python3
"""Render docs/images/dashboard.png: the chart's Grafana dashboard, drawn from a real run.

Why this exists: docs/operations.md shows operators what the dashboard looks like while
things happen, and that picture must come from the service itself, never be drawn by
hand. So this script starts a real etcd and two real `agenttx serve` replicas with
`--metrics-listen`, drives a mixed workload through the public client for about a
minute (commits with effects, every rollback strategy, commit conflicts, client errors,
a webhook receiver that is down for a while, a short etcd stall), scrapes both replicas'
`/metrics` every few seconds, evaluates each panel's PromQL from
`charts/agenttx/files/dashboards/agenttx.json` over the scraped samples, and draws the
panels where the dashboard puts them (matplotlib).

PromQL is parsed with promql-parser (a port of Prometheus' own parser); the small
evaluator below covers what the dashboard uses (selectors with = != =~ !~ matchers,
rate() with Prometheus' extrapolation and counter resets, sum/max/min/avg/count by/without,
histogram_quantile, arithmetic between vectors with identical labels or a scalar) and
raises on anything else, so a new panel with other PromQL fails loudly instead of being
drawn empty. Grafana's variables become: namespace="agenttx", job="agenttx-metrics"
(what the chart's ServiceMonitor yields), `$__rate_interval` = 4 scrape intervals
(Grafana's rule for a short dashboard range).

What it must never do: draw a value it did not scrape, or leave a process running.

    .venv/bin/pip install matplotlib     # dev dependency
    .venv/bin/python scripts/render_dashboard.py [--duration 60] [--scrape-interval 2]
        [--out docs/images/dashboard.png] [--etcd-stall-s 4]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import math
import os
import pathlib
import random
import re
import shutil
import signal
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

import promql_parser
from prometheus_client.parser import text_string_to_metric_families

from agenttx.client import AgentTxError, Client, Conflict, InvalidArgument, NotFound, Policy
from agenttx.embedded_etcd import EmbeddedEtcd, free_port
from agenttx.testing import ServiceProcess, scratch_dir
from agenttx.testing.receivers import PostReceiver

ROOT = pathlib.Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "charts" / "agenttx" / "files" / "dashboards" / "agenttx.json"
NAMESPACE, JOB = "agenttx", "agenttx-metrics"
PODS = ("agenttx-7c9d4-a", "agenttx-7c9d4-b")
LOOKBACK_S = 300.0  # Prometheus' default query.lookback-delta

Labels = frozenset[tuple[str, str]]
Vector = dict[Labels, float]
Value = Vector | float


# ---- scraped samples ---------------------------------------------------------------------

class Samples:
    """Every scraped sample: (labels incl. __name__) -> [(unix time, value)], in time order."""

    def __init__(self) -> None:
        self.series: dict[Labels, list[tuple[float, float]]] = defaultdict(list)
        self.times: list[float] = []
        self.lock = threading.Lock()

    def scrape(self, url: str, target: dict[str, str], at: float) -> None:
        with urllib.request.urlopen(url, timeout=2) as resp:
            text = resp.read().decode()
        with self.lock:
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    if s.name.endswith("_created"):
                        continue  # Prometheus does not ingest these by default either
                    labels = frozenset({**s.labels, **target, "__name__": s.name}.items())
                    self.series[labels].append((at, float(s.value)))

    def select(self, vs: Any) -> Iterator[tuple[Labels, list[tuple[float, float]]]]:
        tests = [_matcher(m) for m in vs.matchers.matchers]
        if vs.name:
            name: str = vs.name
            tests.append(lambda labels: labels.get("__name__") == name)
        for labels, points in self.series.items():
            d = dict(labels)
            if all(test(d) for test in tests):
                yield labels, points


def _matcher(m: Any) -> Callable[[dict[str, str]], bool]:
    op = m.op
    if op == promql_parser.MatchOp.Equal:
        return lambda d: d.get(m.name, "") == m.value
    if op == promql_parser.MatchOp.NotEqual:
        return lambda d: d.get(m.name, "") != m.value
    pattern = re.compile(m.value)
    if op == promql_parser.MatchOp.Re:
        return lambda d: pattern.fullmatch(d.get(m.name, "")) is not None
    if op == promql_parser.MatchOp.NotRe:
        return lambda d: pattern.fullmatch(d.get(m.name, "")) is None
    raise NotImplementedError(f"matcher {m}")


# ---- PromQL over those samples -------------------------------------------------------------

def _drop_name(labels: Labels) -> Labels:
    return frozenset((k, v) for k, v in labels if k != "__name__")


def extrapolated_rate(points: list[tuple[float, float]], start: float, end: float) -> float | None:
    """Prometheus' rate() (promql/functions.go extrapolatedRate, isCounter, isRate)."""
    window = [(t, v) for t, v in points if start < t <= end]
    if len(window) < 2:
        return None
    (t0, first), (t1, last) = window[0], window[-1]
    result = last - first
    for (_, prev), (_, cur) in zip(window, window[1:], strict=False):
        if cur < prev:
            result += prev  # counter reset
    sampled = t1 - t0
    average = sampled / (len(window) - 1)
    to_start, to_end = t0 - start, end - t1
    if result > 0 and first >= 0:
        to_start = min(to_start, sampled * (first / result))
    threshold = average * 1.1
    interval = sampled
    interval += to_start if to_start < threshold else average / 2
    interval += to_end if to_end < threshold else average / 2
    return result * (interval / sampled) / (end - start)


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile over (upper bound, cumulative count) pairs
    (promql/quantile.go bucketQuantile, with ensureMonotonic)."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    buckets = sorted(buckets)
    if len(buckets) < 2 or buckets[-1][0] != math.inf:
        return math.nan
    fixed, top = [], 0.0
    for bound, count in buckets:
        top = max(top, count)
        fixed.append((bound, top))
    observations = fixed[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    b = next(i for i, (_, c) in enumerate(fixed) if c >= rank)
    if b == len(fixed) - 1:
        return fixed[-2][0]
    if b == 0 and fixed[0][0] <= 0:
        return fixed[0][0]
    start, end, count = 0.0, fixed[b][0], fixed[b][1]
    if b > 0:
        start = fixed[b - 1][0]
        count -= fixed[b - 1][1]
        rank -= fixed[b - 1][1]
    return start + (end - start) * (rank / count)


def evaluate(node: Any, samples: Samples, t: float) -> Value:
    kind = type(node).__name__
    if kind == "NumberLiteral":
        return float(node.val)
    if kind == "ParenExpr":
        return evaluate(node.expr, samples, t)
    if kind == "VectorSelector":
        out: Vector = {}
        for labels, points in samples.select(node):
            recent = [v for ts, v in points if t - LOOKBACK_S < ts <= t]
            if recent:
                out[labels] = recent[-1]
        return out
    if kind == "Call":
        return _call(node, samples, t)
    if kind == "AggregateExpr":
        return _aggregate(node, samples, t)
    if kind == "BinaryExpr":
        return _binary(node, samples, t)
    raise NotImplementedError(f"PromQL node {kind}: {node}")


def _call(node: Any, samples: Samples, t: float) -> Value:
    name, args = node.func.name, list(node.args)
    if name == "rate":
        (matrix,) = args
        width = matrix.range.total_seconds()
        out: Vector = {}
        for labels, points in samples.select(matrix.vector_selector):
            value = extrapolated_rate(points, t - width, t)
            if value is not None:
                out[_drop_name(labels)] = value
        return out
    if name == "histogram_quantile":
        q = evaluate(args[0], samples, t)
        vector = evaluate(args[1], samples, t)
        assert isinstance(q, float) and isinstance(vector, dict)
        groups: dict[Labels, list[tuple[float, float]]] = defaultdict(list)
        for labels, value in vector.items():
            d = dict(_drop_name(labels))
            le = float(d.pop("le"))
            groups[frozenset(d.items())].append((le, value))
        return {labels: bucket_quantile(q, buckets) for labels, buckets in groups.items()}
    raise NotImplementedError(f"PromQL function {name}")


_AGGREGATIONS: dict[str, Callable[[list[float]], float]] = {
    "sum": sum, "max": max, "min": min, "count": len,
    "avg": lambda vs: sum(vs) / len(vs),
}


def _aggregate(node: Any, samples: Samples, t: float) -> Vector:
    op = str(node.op)
    if op not in _AGGREGATIONS or node.param is not None:
        raise NotImplementedError(f"PromQL aggregation {op}")
    vector = evaluate(node.expr, samples, t)
    assert isinstance(vector, dict)
    modifier = node.modifier
    keep = set(modifier.labels) if modifier is not None else set()
    by = modifier is None or modifier.type == promql_parser.AggModifierType.By
    groups: dict[Labels, list[float]] = defaultdict(list)
    for labels, value in vector.items():
        d = dict(_drop_name(labels))
        group = {k: v for k, v in d.items() if (k in keep) == by}
        groups[frozenset(group.items())].append(value)
    return {labels: _AGGREGATIONS[op](values) for labels, values in groups.items()}


_ARITHMETIC: dict[str, Callable[[float, float], float]] = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "/": lambda a, b: a / b if b else (math.nan if a == 0 or math.isnan(a)
                                        else math.copysign(math.inf, a)),
}


def _binary(node: Any, samples: Samples, t: float) -> Value:
    op = str(node.op)
    if op not in _ARITHMETIC or node.modifier is not None:
        raise NotImplementedError(f"PromQL binary operator {op} {node.modifier}")
    fn = _ARITHMETIC[op]
    lhs, rhs = evaluate(node.lhs, samples, t), evaluate(node.rhs, samples, t)
    if isinstance(lhs, float) and isinstance(rhs, float):
        return fn(lhs, rhs)
    if isinstance(rhs, float):
        assert isinstance(lhs, dict)
        return {_drop_name(k): fn(v, rhs) for k, v in lhs.items()}
    if isinstance(lhs, float):
        return {_drop_name(k): fn(lhs, v) for k, v in rhs.items()}
    right = {_drop_name(k): v for k, v in rhs.items()}
    return {k: fn(v, right[k]) for k, v in ((_drop_name(k), v) for k, v in lhs.items())
            if k in right}


def substitute(expr: str, rate_interval_s: int) -> str:
    return (expr.replace("$namespace", NAMESPACE).replace("$job", JOB)
            .replace("$__rate_interval", f"{rate_interval_s}s"))


def legend(fmt: str, labels: Labels) -> str:
    d = dict(labels)
    if not fmt:
        return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(d.items())) + "}" if d else "value"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: d.get(m.group(1), ""), fmt).strip()


# ---- the workload --------------------------------------------------------------------------

class Receiver(PostReceiver):
    """A real loopback webhook receiver; `up` False answers 503 (an outage)."""

    def __init__(self) -> None:
        self.up = True
        self.received: Counter[int] = Counter()
        super().__init__(self._on_post, "/hook", name="dashboard-webhook")

    def _on_post(self, handler: BaseHTTPRequestHandler, body: bytes) -> int:
        status = 200 if self.up else 503
        self.received[status] += 1
        return status


@dataclass
class Workload:
    targets: list[str]
    sandbox: pathlib.Path
    duration_s: float
    started: float = field(default_factory=time.monotonic)
    stop: threading.Event = field(default_factory=threading.Event)
    done: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def count(self, what: str) -> None:
        with self.lock:
            self.done[what] += 1

    # one scenario per agent session; each returns what happened
    def order(self, c: Client, u: str, rng: random.Random) -> str:
        with c.transaction(agent_id=f"shop-{rng.randrange(4)}") as tx:
            tx.step("record.insert", {"table": "customers", "id": f"c-{u}"})
            tx.step("record.insert", {"table": "orders", "id": f"o-{u}",
                                      "fields": {"customer_id": "${steps.1.id}", "qty": 2},
                                      "references": {"customer_id": "customers"}})
            tx.step("fs.write", {"path": f"invoices/{u}.txt", "contents": f"order {u}"})
            tx.step("effect.stage", {"channel": "log", "payload": {"order": u}})
            if rng.random() < 0.5:
                tx.step("effect.stage", {"channel": "hooks", "payload": {"order": u}})
        return "committed"

    def retry(self, c: Client, u: str, rng: random.Random) -> str:
        with c.transaction(agent_id="reader") as tx:
            assert tx.step("kv.get", {"key": f"missing-{u}"}).strategy == "LOCAL_BACKTRACK"
            tx.step("kv.put", {"key": f"k-{u}", "value": 1})
        return "local_backtrack"

    def jump(self, c: Client, u: str, rng: random.Random) -> str:
        with c.transaction(agent_id="billing") as tx:
            tx.step("kv.put", {"key": f"pick-{u}", "value": f"nobody-{u}"})
            r = tx.step("record.insert", {"table": "orders", "id": f"j-{u}",
                                          "fields": {"customer_id": "${steps.1.value}"},
                                          "references": {"customer_id": "customers"}})
            assert r.strategy == "DEPENDENCY_JUMP", r
            tx.step("record.insert", {"table": "customers", "id": f"jc-{u}"})
        return "dependency_jump"

    def reset(self, c: Client, u: str, rng: random.Random) -> str:
        with c.transaction(agent_id="planner", policy=Policy(max_local_depth=0)) as tx:
            tx.step("kv.put", {"key": f"plan-{u}", "value": 1})
            assert tx.step("kv.gett", {"key": f"plan-{u}"}).strategy == "GLOBAL_RESET"
            tx.step("kv.put", {"key": f"plan-{u}", "value": 2})
        return "global_reset"

    def abort(self, c: Client, u: str, rng: random.Random) -> str:
        tx = c.begin(agent_id="strict", policy=Policy(max_local_depth=0, max_global_resets=0))
        tx.step("kv.put", {"key": f"s-{u}", "value": 1})
        r = tx.step("record.get", {"table": "orders", "id": f"none-{u}"})
        assert r.strategy == "ABORT" and r.ended, r
        return "abort"

    def give_up(self, c: Client, u: str, rng: random.Random) -> str:
        with contextlib.suppress(RuntimeError), c.transaction(agent_id="explorer") as tx:
            tx.step("fs.write", {"path": f"drafts/{u}.md", "contents": "draft"})
            raise RuntimeError("the agent gave up")  # leaving the block aborts
        return "client_abort"

    def conflict(self, c: Client, u: str, rng: random.Random) -> str:
        first, second = c.begin(agent_id="racer-1"), c.begin(agent_id="racer-2")
        first.step("kv.put", {"key": f"stock-{u}", "value": 1})
        second.step("kv.put", {"key": f"stock-{u}", "value": 2})
        second.commit()
        try:
            first.commit()
        except Conflict:
            return "conflict"
        return "committed"

    def mistakes(self, c: Client, u: str, rng: random.Random) -> str:
        with contextlib.suppress(NotFound):
            c.get(str(uuid.uuid4()))  # an id nobody began: NOT_FOUND
        with contextlib.suppress(InvalidArgument):
            c.begin(policy=Policy(max_local_depth=99))  # out of range: INVALID_ARGUMENT
        return "client_errors"

    def manual(self, c: Client, hold_until: float) -> None:
        """A transaction whose undo cannot run (a directory stands where its file was)
        waits for a manual rollback; resolved once `hold_until` has passed."""
        u = uuid.uuid4().hex[:8]
        tx = c.begin(agent_id="reporter")
        tx.step("kv.put", {"key": f"r-{u}", "value": 1})
        tx.step("fs.write", {"path": f"reports/{u}.txt", "contents": "q3"})
        blocker = self.sandbox / "reports" / f"{u}.txt"
        blocker.unlink()
        blocker.mkdir()
        (blocker / "in-the-way").write_text("x")
        assert not tx.rollback(to_step=1).rolled_back
        self.count("manual_stuck")
        while self.elapsed() < hold_until and not self.stop.is_set():
            time.sleep(0.5)
        shutil.rmtree(blocker)
        assert tx.rollback().rolled_back
        self.count("manual_resolved")

    def agent(self, index: int) -> None:
        rng = random.Random(index)
        scenarios: list[tuple[Callable[[Client, str, random.Random], str], int]] = [
            (self.order, 40), (self.retry, 14), (self.jump, 10), (self.reset, 8),
            (self.abort, 5), (self.give_up, 5), (self.conflict, 8), (self.mistakes, 10)]
        funcs, weights = zip(*scenarios, strict=True)
        with Client(self.targets[index % len(self.targets)]) as c:
            while not self.stop.is_set() and self.elapsed() < self.duration_s:
                scenario = rng.choices(funcs, weights)[0]
                try:
                    self.count(scenario(c, uuid.uuid4().hex[:10], rng))
                except AgentTxError as exc:  # etcd stalled, a replica not ready, ...
                    self.count(f"error {type(exc).__name__}")
                    time.sleep(0.2)
                time.sleep(rng.uniform(0.02, 0.12))


# ---- drawing --------------------------------------------------------------------------------

UNITS: dict[str, tuple[str, Callable[[float], str]]] = {
    "reqps": ("req/s", lambda v: f"{v:.3g}"),
    "ops": ("ops/s", lambda v: f"{v:.3g}"),
    "s": ("", lambda v: f"{v * 1000:.3g} ms" if abs(v) < 1 else f"{v:.3g} s"),
    "percentunit": ("", lambda v: f"{v * 100:.3g}%"),
    "short": ("", lambda v: f"{v:.4g}"),
}


@dataclass
class Panel:
    spec: dict[str, Any]
    lines: dict[str, list[tuple[float, float]]]


def compute(dashboard: dict[str, Any], samples: Samples, rate_interval_s: int,
            step_s: float) -> list[Panel]:
    times = samples.times
    grid = [times[0] + i * step_s for i in range(int((times[-1] - times[0]) / step_s) + 1)]
    panels = []
    for spec in dashboard["panels"]:
        lines: dict[str, list[tuple[float, float]]] = {}
        for target in spec.get("targets", []):
            ast = promql_parser.parse(substitute(target["expr"], rate_interval_s))
            for t in grid:
                value = evaluate(ast, samples, t)
                vector = {frozenset(): value} if isinstance(value, float) else value
                for labels, v in vector.items():
                    lines.setdefault(legend(target.get("legendFormat", ""), labels),
                                     []).append((t, v))
        panels.append(Panel(spec, lines))
    return panels


SPAN_COLOURS = {"webhook receiver down": "#f5a623", "etcd stalled": "#d0021b"}


def draw(panels: list[Panel], out: pathlib.Path, t0: float, t1: float,
         spans: list[tuple[str, float, float]], caption: tuple[str, str]) -> None:
    """The dashboard's grid (24 columns, rows of `unit_h` inches); outages shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter, MultipleLocator

    unit_h = 0.36  # inches per grid row; 24 grid columns span the width
    width = 22.0
    rows = max(p.spec["gridPos"]["y"] + p.spec["gridPos"]["h"] for p in panels)
    header = 1.0
    height = rows * unit_h + header
    fig = plt.figure(figsize=(width, height), dpi=100, facecolor="#f4f5f5")

    def rect(gp: dict[str, int], pad: float = 0.06) -> tuple[float, float, float, float]:
        x0 = gp["x"] / 24 * width + pad
        w = gp["w"] / 24 * width - 2 * pad
        top = header + gp["y"] * unit_h + pad
        h = gp["h"] * unit_h - 2 * pad
        return x0 / width, 1 - (top + h) / height, w / width, h / height

    fig.text(0.01, 1 - 0.35 / height, "AgentTx", fontsize=20, weight="bold", va="center")
    fig.text(0.085, 1 - 0.3 / height, caption[0], fontsize=11, va="center", color="#444")
    fig.text(0.085, 1 - 0.62 / height, caption[1], fontsize=11, va="center", color="#444")
    fig.legend(handles=[Patch(color=SPAN_COLOURS[w], alpha=0.15, label=w)
                        for w in dict.fromkeys(w for w, _, _ in spans)],
               loc="center right", bbox_to_anchor=(0.995, 1 - 0.45 / height), ncol=1,
               fontsize=10, frameon=False)
    palette = [*plt.rcParams["axes.prop_cycle"].by_key()["color"], "#8c564b", "#17becf",
               "#bcbd22", "#393b79", "#637939", "#843c39"]
    for panel in panels:
        spec, gp = panel.spec, panel.spec["gridPos"]
        x, y, w, h = rect(gp)
        if spec["type"] == "row":
            fig.text(x, y + h / 2, spec["title"], fontsize=14, weight="bold", va="center")
            fig.add_artist(plt.Line2D([x, x + w], [y + 0.1 * h, y + 0.1 * h], color="#bbb",
                                      transform=fig.transFigure, lw=1))
            continue
        box = fig.add_axes((x, y, w, h))
        box.set_facecolor("white")
        box.set_xticks([])
        box.set_yticks([])
        for s in box.spines.values():
            s.set_color("#d0d0d0")
        title_h = 0.32 / (gp["h"] * unit_h)
        box.text(0.015, 1 - title_h / 2, spec["title"], fontsize=10.5, weight="bold",
                 va="center", transform=box.transAxes)
        unit, fmt = UNITS.get(spec.get("fieldConfig", {}).get("defaults", {}).get("unit",
                                                                                  "short"),
                              UNITS["short"])
        last = {name: next((v for _, v in reversed(pts) if not math.isnan(v)), math.nan)
                for name, pts in panel.lines.items()}
        if spec["type"] == "stat":
            if not last:
                text = "No data"
            elif list(last) == [""] or len(last) == 1:
                text = fmt(next(iter(last.values())))
            else:
                text = "   ".join(f"{k} {fmt(v)}" for k, v in sorted(last.items()))
            big = 26 if len(text) < 8 else 15
            box.text(0.5, 0.5, text, fontsize=big, weight="bold", ha="center", va="center",
                     color="#1f7a1f", transform=box.transAxes, zorder=3)
            if spec.get("options", {}).get("graphMode") == "area" and len(panel.lines) == 1:
                # Grafana's sparkline: the whole run, under the last value
                (pts,) = panel.lines.values()
                spark = fig.add_axes((x, y + 0.04 * h, w, h * 0.4))
                spark.set_axis_off()
                spark.set_xlim(0, t1 - t0)
                xs, ys = [t - t0 for t, _ in pts], [0 if math.isnan(v) else v for _, v in pts]
                spark.fill_between(xs, ys, color="#1f7a1f", alpha=0.15, lw=0)
                spark.plot(xs, ys, color="#1f7a1f", alpha=0.5, lw=1)
                spark.set_ylim(0, max(1.0, max(ys, default=0)) * 1.1)
            continue
        shown = {k: pts for k, pts in panel.lines.items()
                 if any(v != 0 and not math.isnan(v) for _, v in pts)}
        hidden = len(panel.lines) - len(shown)
        ncol = max(1, min(len(shown), gp["w"] // 4))
        legend_rows = math.ceil(len(shown) / ncol) if shown else 1
        legend_h = min(0.45, (0.2 * legend_rows + 0.12) / (gp["h"] * unit_h))
        plot = fig.add_axes((x + 0.045 * w, y + (legend_h + 0.1) * h, w * 0.935,
                             h * (1 - legend_h - title_h - 0.16)))
        for i, (name, pts) in enumerate(sorted(shown.items())):
            plot.plot([(t - t0) for t, _ in pts], [v for _, v in pts], lw=1.4,
                      color=palette[i % len(palette)], label=name)
        for what, start, end in spans:
            plot.axvspan(start - t0, end - t0, color=SPAN_COLOURS[what], alpha=0.15, lw=0)
        plot.set_xlim(0, t1 - t0)
        plot.xaxis.set_major_locator(MultipleLocator(10))
        plot.tick_params(labelsize=8)
        plot.yaxis.set_major_formatter(FuncFormatter(lambda v, _, fmt=fmt: fmt(v)))
        plot.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{int(v)}s"))
        plot.grid(alpha=0.3)
        if unit:
            plot.set_ylabel(unit, fontsize=8)
        if shown:
            plot.set_ylim(bottom=min(0, plot.get_ylim()[0]))
            plot.legend(loc="upper left", bbox_to_anchor=(0, -0.13), ncol=ncol, fontsize=7.5,
                        frameon=False, handlelength=1.2, columnspacing=1.0)
        else:
            plot.text(0.5, 0.5, "0 throughout" if panel.lines else "No data", ha="center",
                      va="center", color="#888", transform=plot.transAxes)
            plot.set_ylim(-0.05, 1)
        if hidden:
            box.text(0.985, 1 - title_h / 2, f"{hidden} series at 0 not drawn", fontsize=7.5,
                     ha="right", va="center", color="#888", transform=box.transAxes)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100, facecolor=fig.get_facecolor())
    plt.close(fig)


# ---- the run ----------------------------------------------------------------------------------

@dataclass
class Recording:
    """What one run produced: the samples, the outage windows, how it was run."""

    samples: Samples
    spans: list[tuple[str, float, float]]  # (what, unix start, unix end)
    meta: dict[str, Any]

    def save(self, path: pathlib.Path) -> None:
        path.write_text(json.dumps({
            "meta": self.meta, "spans": self.spans, "times": self.samples.times,
            "series": [[dict(labels), points] for labels, points in self.samples.series.items()],
        }))

    @classmethod
    def load(cls, path: pathlib.Path) -> Recording:
        data = json.loads(path.read_text())
        samples = Samples()
        samples.times = data["times"]
        for labels, points in data["series"]:
            samples.series[frozenset(labels.items())] = [(t, v) for t, v in points]
        return cls(samples, [tuple(s) for s in data["spans"]], data["meta"])


def record(args: argparse.Namespace) -> Recording:
    """Run etcd, two replicas and the workload; scrape both replicas until it ends."""
    work = scratch_dir("agenttx-dashboard-")
    samples = Samples()
    receiver = Receiver().start()
    etcd: EmbeddedEtcd | None = None
    replicas: list[tuple[ServiceProcess, str, dict[str, str]]] = []
    stalled_pid = 0
    events: list[tuple[str, float]] = []  # (what began, or "" for its end; unix time)
    d = args.duration
    try:
        etcd = EmbeddedEtcd(work / "etcd").start()
        sandbox = work / "sandbox"
        sandbox.mkdir()
        channels = {"hooks": {"kind": "webhook", "url": receiver.url, "timeout_s": 1}}
        for pod in PODS:
            port = free_port()
            proc = ServiceProcess(pod, etcd_endpoints=etcd.endpoints, prefix="/agenttx",
                                  fs_root=str(sandbox), workdir=work,
                                  env={"AGENTTX_EFFECT_CHANNELS": json.dumps(channels)},
                                  extra_args=["--metrics-listen", f"127.0.0.1:{port}",
                                              "--etcd-timeout-s", "1.5",
                                              "--effect-poll-s", "0.5"])
            replicas.append((proc, f"http://127.0.0.1:{port}/metrics",
                             {"namespace": NAMESPACE, "job": JOB, "pod": pod,
                              "instance": f"127.0.0.1:{port}"}))
        for proc, _, _ in replicas:
            proc.start()
        load = Workload([p.target for p, _, _ in replicas], sandbox, d)

        def scraper() -> None:
            while not load.stop.is_set():
                at = time.time()
                for _, url, target in replicas:
                    with contextlib.suppress(OSError):
                        samples.scrape(url, target, at)
                samples.times.append(at)
                load.stop.wait(args.scrape_interval)

        manual_client = Client(replicas[0][0].target)

        def operator_story() -> None:
            time.sleep(0.2 * d)
            load.manual(manual_client, 0.55 * d)

        threads = [threading.Thread(target=scraper, daemon=True),
                   threading.Thread(target=operator_story, daemon=True)]
        threads += [threading.Thread(target=load.agent, args=(i,), daemon=True)
                    for i in range(args.agents)]
        started = time.time()
        for th in threads:
            th.start()
        # the outage script: a webhook receiver down, then an etcd stall
        while load.elapsed() < d + args.scrape_interval * 2:
            e = load.elapsed()
            up = not (0.3 * d <= e < 0.5 * d)
            if up != receiver.up:
                receiver.up = up
                events.append(("webhook receiver down" if not up else "", time.time()))
            if args.etcd_stall_s and not stalled_pid and e >= 0.7 * d:
                stalled_pid = etcd.members[0].process.pid
                events.append(("etcd stalled", time.time()))
                os.kill(stalled_pid, signal.SIGSTOP)
                time.sleep(args.etcd_stall_s)
                os.kill(stalled_pid, signal.SIGCONT)
                events.append(("", time.time()))
                load.count("etcd stalls")
            time.sleep(0.1)
        load.stop.set()
        for th in threads:
            th.join(timeout=30)
        manual_client.close()
        print("workload:", dict(sorted(load.done.items())), file=sys.stderr)
        print(f"webhook answers: {dict(receiver.received)}", file=sys.stderr)
    finally:
        if stalled_pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stalled_pid, signal.SIGCONT)
        for proc, _, _ in replicas:
            proc.stop()
        if etcd is not None:
            etcd.stop()
        receiver.stop()
        shutil.rmtree(work, ignore_errors=True)
    spans = [(what, start, end)
             for (what, start), (_, end) in zip(events[::2], events[1::2], strict=False)]
    return Recording(samples, spans, {
        "started": started, "duration_s": d, "agents": args.agents, "replicas": len(PODS),
        "scrape_interval_s": args.scrape_interval, "workload": dict(load.done)})


def render(rec: Recording, out: pathlib.Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    meta = rec.meta
    step = float(meta["scrape_interval_s"])
    rate_interval = int(4 * step)
    panels = compute(dashboard, rec.samples, rate_interval, step)
    stamp = datetime.datetime.fromtimestamp(meta["started"], datetime.UTC).strftime(
        "%Y-%m-%d %H:%M UTC")
    caption = (f"{dashboard['title']} dashboard ({DASHBOARD.relative_to(ROOT)}), drawn by "
               f"scripts/render_dashboard.py from a real run on {stamp}",
               f"{meta['replicas']} replicas + etcd, {meta['agents']} agents for "
               f"{meta['duration_s']:g} s; scraped every {step:g} s, $__rate_interval = "
               f"{rate_interval}s; x axis: seconds since the first scrape")
    draw(panels, out, rec.samples.times[0], rec.samples.times[-1], rec.spans, caption)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=60.0, help="workload seconds")
    parser.add_argument("--scrape-interval", type=float, default=2.0, help="seconds")
    parser.add_argument("--agents", type=int, default=3, help="concurrent agent threads")
    parser.add_argument("--etcd-stall-s", type=float, default=4.0,
                        help="SIGSTOP etcd this long at 70%% of the run (0: no stall)")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "docs/images/dashboard.png")
    parser.add_argument("--save", type=pathlib.Path, metavar="JSON",
                        help="also write the scraped samples and outage windows here")
    parser.add_argument("--from", dest="source", type=pathlib.Path, metavar="JSON",
                        help="draw a run saved with --save instead of running one")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("matplotlib") is None:  # fail before a minute of workload
        parser.error("needs matplotlib: .venv/bin/pip install matplotlib")
    rec = Recording.load(args.source) if args.source else record(args)
    if args.save:
        rec.save(args.save)
    render(rec, args.out)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
