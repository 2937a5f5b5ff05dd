"""The chart runs one replica process per CPU a service pod is given (`agenttx serve
--workers`, docs/operations.md), and scrapes every worker's own /metrics port."""

from __future__ import annotations

from collections.abc import Iterator

import helm_python
import pytest

from agenttx.commands import serve_settings
from support.chart import CHART, container, find, one, render


@pytest.fixture(scope="module")
def chart() -> Iterator[helm_python.Chart]:
    with helm_python.Chart.load(CHART) as c:
        yield c


def _workers(chart: helm_python.Chart, values: dict) -> tuple[list[str], list]:
    docs = render(chart, values)
    c = container(one(docs, "Deployment", "agenttx"), "agenttx")
    return c["args"], c["ports"]


@pytest.mark.parametrize(("limits", "expected"), [
    ({}, 1), ({"cpu": "500m"}, 1), ({"cpu": "1"}, 1), ({"cpu": "1500m"}, 2), ({"cpu": 2}, 2),
    ({"cpu": "2.5"}, 3), ({"cpu": "4000m"}, 4)])
def test_workers_follow_the_cpu_limit(chart, limits, expected):
    args, _ = _workers(chart, {"service": {"resources": {"limits": {"memory": "1Gi", **limits}}}})
    assert serve_settings(args[1:]).workers == expected
    assert ("--workers" in args) == (expected > 1)


def test_workers_set_explicitly_win_over_the_cpu_limit(chart):
    args, _ = _workers(chart, {"service": {"workers": 3,
                                           "resources": {"limits": {"cpu": "8"}}}})
    assert serve_settings(args[1:]).workers == 3


def test_every_worker_metrics_port_is_exposed_served_and_scraped(chart):
    values = {"service": {"workers": 3},
              "metrics": {"port": 9464, "serviceMonitor": {"enabled": True}}}
    docs = render(chart, values)
    c = container(one(docs, "Deployment", "agenttx"), "agenttx")
    settings = serve_settings(c["args"][1:])
    assert (settings.workers, settings.metrics_listen) == (3, "0.0.0.0:9464")
    names = ["metrics", "metrics-w1", "metrics-w2"]
    assert [(p["name"], p["containerPort"]) for p in c["ports"]][1:] == \
        list(zip(names, [9464, 9465, 9466], strict=True))
    svc = one(docs, "Service", "agenttx-metrics")
    assert [(p["name"], p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == \
        [(n, port, n) for n, port in zip(names, [9464, 9465, 9466], strict=True)]
    (monitor,) = find(docs, "ServiceMonitor")
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == names
    (policy,) = [p for p in find(docs, "NetworkPolicy") if p["metadata"]["name"] == "agenttx"]
    scraped = [r for r in policy["spec"]["ingress"]
               if any(p["port"] == "metrics" for p in r["ports"])]
    assert [p["port"] for p in scraped[0]["ports"]] == names
