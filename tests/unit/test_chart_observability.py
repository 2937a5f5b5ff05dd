"""What the chart promises for observability (SPEC §10, §10.1 "Chart" and "Metrics").

The metrics port and its headless Service, the ServiceMonitor and PrometheusRule
(rendered offline, not gated on .Capabilities, valid against the upstream CRD schemas),
the six alerts with their runbooks and thresholds, and the Grafana dashboard. Every
PromQL expression, in the alerts and the dashboard, is parsed with promql-parser (a port
of Prometheus' own parser), and every metric and label it uses must be one the service
exports: the names come from `agenttx.observability.metrics.EXPORTED` and the label
names from the real collectors, so a renamed metric or label cannot leave a panel empty
or an alert silent. The dashboard is decoded with Grafana's own schema types
(grafana-foundation-sdk) so a misspelt field is caught.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import grpc
import helm_python
import promql_parser
import pytest

from agenttx.observability import metrics as m
from support.chart import (
    CHART,
    MONITORING,
    NS,
    VARIANTS,
    Doc,
    container,
    find,
    one,
    render,
    validate,
)

DASHBOARD = CHART / "files" / "dashboards" / "agenttx.json"
ALERTS = ("AgentTxHighErrorRate", "AgentTxHighLatencyP99", "AgentTxOutboxBacklogAge",
          "AgentTxAwaitingManualRollback", "AgentTxDeadLetters",
          "AgentTxApprovalPendingTooLong", "AgentTxNoDispatcherLeader")
SERVER_ERRORS = {"INTERNAL", "UNAVAILABLE", "UNKNOWN", "DEADLINE_EXCEEDED", "DATA_LOSS"}
# Labels Prometheus adds to every scraped series (ServiceMonitor target labels).
TARGET_LABELS = {"namespace", "job", "pod", "instance", "service", "container", "endpoint"}


@pytest.fixture(scope="module")
def chart() -> Iterator[helm_python.Chart]:
    with helm_python.Chart.load(CHART) as c:
        yield c


# ---- what the service exports ----------------------------------------------------------

def exported_labels() -> dict[str, set[str]]:
    """Series name -> label names, from the real collectors of a fresh Metrics()."""
    from prometheus_client.metrics import MetricWrapperBase

    fresh = m.Metrics()
    out: dict[str, set[str]] = {}
    for collector in vars(fresh).values():
        if not isinstance(collector, MetricWrapperBase):
            continue
        base = collector._name  # prometheus_client keeps label names on the wrapper
        labels = set(collector._labelnames)
        kind = collector._type
        if kind == "counter":
            out[f"{base}_total"] = labels
        elif kind == "histogram":
            out[f"{base}_bucket"] = labels | {"le"}
            out[f"{base}_sum"] = out[f"{base}_count"] = labels
        else:
            out[base] = labels
    return out


EXPORTED_SERIES = exported_labels()


def test_exported_series_match_the_published_names() -> None:
    """EXPORTED (what the docs and tests cite) and the collectors agree."""
    suffixes = ("_bucket", "_sum", "_count")
    bases = {re.sub(r"(_bucket|_sum|_count)$", "", s) if s.endswith(suffixes) else s
             for s in EXPORTED_SERIES}
    assert bases == set(m.EXPORTED)


def base_name(series: str) -> str:
    for suffix in ("_bucket", "_sum", "_count"):
        if series.endswith(suffix) and series.removesuffix(suffix) in m.EXPORTED:
            return series.removesuffix(suffix)
    return series


def check_promql(expr: str) -> set[str]:
    """Parse `expr`; every selector must name an exported series and only its labels, and
    every by/without label must exist on a series aggregated there. Returns the metric
    names (suffixes stripped) it reads."""
    tree = promql_parser.parse(expr)
    used: set[str] = set()
    problems: list[str] = []

    def series_in(node: Any) -> list[str]:
        found: list[str] = []

        def visit(n: Any) -> None:
            if isinstance(n, promql_parser.VectorSelector) and n.name:
                found.append(n.name)
        promql_parser.walk(node, visit)
        return found

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            name = node.name
            if name not in EXPORTED_SERIES:
                problems.append(f"{name} is not exported")
                return
            used.add(base_name(name))
            for matcher in node.matchers.matchers:
                if matcher.name not in EXPORTED_SERIES[name] | TARGET_LABELS:
                    problems.append(f"{name} has no label {matcher.name}")
                if matcher.name == "code":
                    codes = set(matcher.value.split("|"))
                    if not codes <= {c.name for c in grpc.StatusCode}:
                        problems.append(f"code values {codes} are not gRPC code names")
                if matcher.name == "role" and matcher.value not in m.ROLES:
                    problems.append(f"role {matcher.value} is not one of {m.ROLES}")
        if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            available = set(TARGET_LABELS)
            for series in series_in(node.expr):
                available |= EXPORTED_SERIES.get(series, set())
            missing = set(node.modifier.labels) - available
            if missing:
                problems.append(f"aggregation by {sorted(missing)} over {series_in(node.expr)}")

    promql_parser.walk(tree, visit)
    assert problems == [], (expr, problems)
    return used


def test_the_promql_check_catches_mistakes() -> None:
    for bad in ("sum(rate(agenttx_step_total[5m]))",
                "sum by (tool) (rate(agenttx_rollbacks_total[5m]))",
                'agenttx_leader{role="reaper2"}',
                'agenttx_rpc_duration_seconds_count{code="500"}',
                "histogram_quantile(0.99, sum by (le) (rate(agenttx_outbox_depth_bucket[5m])))"):
        with pytest.raises(AssertionError):
            check_promql(bad)
    with pytest.raises(ValueError):
        promql_parser.parse("sum by (rpc (rate(agenttx_steps_total[5m]))")


# ---- the metrics port ------------------------------------------------------------------

def test_metrics_port_and_headless_service(chart: helm_python.Chart) -> None:
    docs = render(chart)
    dep = one(docs, "Deployment", "agenttx")
    c = container(dep, "agenttx")
    assert c["args"][-2:] == ["--metrics-listen", "0.0.0.0:9090"]
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in c["ports"]
    svc = one(docs, "Service", "agenttx-metrics")
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": 9090, "targetPort": "metrics",
                                     "protocol": "TCP", "appProtocol": "http"}]
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    # The client Service (possibly a LoadBalancer) does not carry the metrics port.
    assert [p["name"] for p in one(docs, "Service", "agenttx")["spec"]["ports"]] == ["grpc"]


def test_metrics_port_is_configurable(chart: helm_python.Chart) -> None:
    docs = render(chart, {"metrics": {"port": 9464}})
    c = container(one(docs, "Deployment", "agenttx"), "agenttx")
    assert c["args"][-1] == "0.0.0.0:9464"
    assert one(docs, "Service", "agenttx-metrics")["spec"]["ports"][0]["port"] == 9464


def test_metrics_can_be_turned_off(chart: helm_python.Chart) -> None:
    docs = render(chart, {"metrics": {"enabled": False, **{
        k: {"enabled": True} for k in ("serviceMonitor", "prometheusRule", "dashboard")}}})
    c = container(one(docs, "Deployment", "agenttx"), "agenttx")
    assert "--metrics-listen" not in c["args"]
    assert [p["name"] for p in c["ports"]] == ["grpc"]
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert find(docs, kind) == []
    assert find(docs, "Service", "agenttx-metrics") == []
    assert find(docs, "ConfigMap", "agenttx-dashboard") == []


# ---- ServiceMonitor --------------------------------------------------------------------

def test_monitoring_objects_are_opt_in(chart: helm_python.Chart) -> None:
    docs = render(chart)
    assert find(docs, "ServiceMonitor") == [] and find(docs, "PrometheusRule") == []
    assert find(docs, "ConfigMap", "agenttx-dashboard") == []


def test_service_monitor_scrapes_the_metrics_service(chart: helm_python.Chart) -> None:
    # Rendered offline: helm-python-sdk registers no monitoring.coreos.com API version.
    docs = render(chart, MONITORING)
    sm = one(docs, "ServiceMonitor", "agenttx")
    validate(sm)
    assert sm["metadata"]["namespace"] == NS
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [NS]}
    selector = sm["spec"]["selector"]["matchLabels"]
    selected = [s["metadata"]["name"] for s in find(docs, "Service")
                if selector.items() <= s["metadata"]["labels"].items()]
    assert selected == ["agenttx-metrics"]
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint == {"port": "metrics", "path": "/metrics", "scheme": "http",
                        "interval": "30s", "scrapeTimeout": "10s"}


def test_service_monitor_options(chart: helm_python.Chart) -> None:
    relabel = [{"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_node_name"],
                "targetLabel": "node"}]
    docs = render(chart, {"metrics": {"serviceMonitor": {
        "enabled": True, "namespace": "monitoring", "interval": "15s",
        "relabelings": relabel, "metricRelabelings": relabel}}})
    sm = one(docs, "ServiceMonitor", "agenttx")
    validate(sm)
    assert sm["metadata"]["namespace"] == "monitoring"
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [NS]}  # still the release's
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["interval"] == "15s"
    assert endpoint["relabelings"] == endpoint["metricRelabelings"] == relabel


# ---- PrometheusRule --------------------------------------------------------------------

def rules(docs: list[Doc]) -> dict[str, Doc]:
    rule = one(docs, "PrometheusRule", "agenttx")
    validate(rule)
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


def test_prometheus_rule_has_the_six_alerts(chart: helm_python.Chart) -> None:
    alerts = rules(render(chart, MONITORING))
    assert tuple(alerts) == ALERTS
    for name, rule in alerts.items():
        ann = rule["annotations"]
        assert set(ann) == {"summary", "description", "runbook_url"}, name
        assert ann["summary"] and ann["description"], name
        assert ann["runbook_url"] == ("https://github.com/agenttx/agenttx/blob/main/docs/"
                                      f"operations.md#{name.lower()}")
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert re.fullmatch(r"\d+[smh]", rule["for"]), name


def test_alert_expressions_use_only_exported_metrics(chart: helm_python.Chart) -> None:
    alerts = rules(render(chart, MONITORING))
    used = {name: check_promql(rule["expr"]) for name, rule in alerts.items()}
    assert used == {
        "AgentTxHighErrorRate": {"agenttx_rpc_duration_seconds"},
        "AgentTxHighLatencyP99": {"agenttx_rpc_duration_seconds"},
        "AgentTxOutboxBacklogAge": {"agenttx_outbox_oldest_age_seconds"},
        "AgentTxAwaitingManualRollback": {"agenttx_transactions_awaiting_rollback"},
        "AgentTxDeadLetters": {"agenttx_effects_dead_letters"},
        "AgentTxApprovalPendingTooLong": {"agenttx_approval_oldest_pending_seconds"},
        "AgentTxNoDispatcherLeader": {"agenttx_leader"},
    }
    # Server errors are exactly the five codes the operations guide names.
    codes = re.search(r'code=~"([^"]+)"', alerts["AgentTxHighErrorRate"]["expr"])
    assert codes and set(codes.group(1).split("|")) == SERVER_ERRORS
    # Every selector is scoped to this release's metrics Service.
    for rule in alerts.values():
        for selector in re.findall(r"\{([^}]*)\}", rule["expr"]):
            assert f'namespace="{NS}",job="agenttx-metrics"' in selector, rule["alert"]


def test_alert_thresholds_come_from_values(chart: helm_python.Chart) -> None:
    defaults = rules(render(chart, MONITORING))
    assert defaults["AgentTxHighErrorRate"]["expr"].endswith(") > 0.05")
    assert defaults["AgentTxHighLatencyP99"]["expr"].endswith(") > 1")
    assert defaults["AgentTxOutboxBacklogAge"]["expr"].endswith(") > 300")
    assert defaults["AgentTxAwaitingManualRollback"]["expr"].endswith(") > 0")
    assert defaults["AgentTxDeadLetters"]["expr"].endswith(") > 0")
    assert (defaults["AgentTxDeadLetters"]["for"],
            defaults["AgentTxDeadLetters"]["labels"]["severity"]) == ("1m", "warning")
    assert defaults["AgentTxApprovalPendingTooLong"]["expr"].endswith(") > 3600")
    assert (defaults["AgentTxApprovalPendingTooLong"]["for"],
            defaults["AgentTxApprovalPendingTooLong"]["labels"]["severity"]) == ("5m",
                                                                                 "warning")
    changed = rules(render(chart, {"metrics": {"prometheusRule": {
        "enabled": True, "selector": 'job="agenttx"',
        "runbookBaseUrl": "https://runbooks.example/agenttx",
        "additionalAlertLabels": {"team": "platform"},
        "highErrorRate": {"threshold": 0.01, "for": "2m", "severity": "warning"},
        "highLatencyP99": {"thresholdSeconds": 0.25},
        "outboxBacklogAge": {"thresholdSeconds": 60},
        "awaitingManualRollback": {"threshold": 3, "for": "1h"},
        "deadLetters": {"threshold": 5, "for": "10m", "severity": "critical"},
        "approvalPendingTooLong": {"thresholdSeconds": 900, "for": "1m",
                                   "severity": "critical"},
        "noDispatcherLeader": {"for": "1m"}}}}))
    assert changed["AgentTxHighErrorRate"]["expr"].endswith(") > 0.01")
    assert (changed["AgentTxHighErrorRate"]["for"],
            changed["AgentTxHighErrorRate"]["labels"]) == ("2m", {"severity": "warning",
                                                                  "team": "platform"})
    assert changed["AgentTxHighLatencyP99"]["expr"].endswith(") > 0.25")
    assert changed["AgentTxOutboxBacklogAge"]["expr"].endswith(") > 60")
    assert changed["AgentTxAwaitingManualRollback"]["expr"].endswith(") > 3")
    assert changed["AgentTxAwaitingManualRollback"]["for"] == "1h"
    assert changed["AgentTxNoDispatcherLeader"]["for"] == "1m"
    assert changed["AgentTxDeadLetters"]["expr"].endswith(") > 5")
    assert (changed["AgentTxDeadLetters"]["for"],
            changed["AgentTxDeadLetters"]["labels"]["severity"]) == ("10m", "critical")
    assert changed["AgentTxApprovalPendingTooLong"]["expr"].endswith(") > 900")
    assert (changed["AgentTxApprovalPendingTooLong"]["for"],
            changed["AgentTxApprovalPendingTooLong"]["labels"]["severity"]) == ("1m",
                                                                                "critical")
    assert changed["AgentTxOutboxBacklogAge"]["annotations"]["runbook_url"] == (
        "https://runbooks.example/agenttx#agenttxoutboxbacklogage")
    for rule in changed.values():
        check_promql(rule["expr"])
        assert 'namespace="' not in rule["expr"]  # the given selector replaced the default


def test_alert_annotations_are_prometheus_templates(chart: helm_python.Chart) -> None:
    """Helm must pass Prometheus' {{ $labels.* }} / {{ $value }} through untouched."""
    alerts = rules(render(chart, MONITORING))
    assert "{{ $value | humanizePercentage }}" in alerts["AgentTxHighErrorRate"][
        "annotations"]["description"]
    assert "{{ $labels.rpc }}" in alerts["AgentTxHighLatencyP99"]["annotations"]["summary"]


# ---- the Grafana dashboard -------------------------------------------------------------

def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in board["panels"]:
        out.append(p)
        out += p.get("panels", [])
    return out


def promql_of(expr: str) -> str:
    """Grafana's variables as Prometheus would see them after interpolation."""
    return expr.replace("$__rate_interval", "5m")


def unknown_fields(given: Any, decoded: Any, path: str = "$") -> list[str]:
    if isinstance(given, dict):
        if not isinstance(decoded, dict):
            return [path]
        out = []
        for k, v in given.items():
            out += ([f"{path}.{k}"] if k not in decoded
                    else unknown_fields(v, decoded[k], f"{path}.{k}"))
        return out
    if isinstance(given, list):
        if not isinstance(decoded, list) or len(given) != len(decoded):
            return [path]
        return [u for i, (a, b) in enumerate(zip(given, decoded, strict=True))
                for u in unknown_fields(a, b, f"{path}[{i}]")]
    return [] if given == decoded else [f"{path}: {given!r} became {decoded!r}"]


def test_dashboard_fits_grafanas_schema() -> None:
    from grafana_foundation_sdk.cog import plugins
    from grafana_foundation_sdk.models.dashboard import Dashboard

    plugins.register_default_plugins()
    board = dashboard()
    decoded = Dashboard.from_json(board)
    again = json.loads(json.dumps(decoded.to_json(), default=lambda o: o.to_json()))
    assert unknown_fields(board, again) == []
    assert board["uid"] == "agenttx-overview" and board["title"] == "AgentTx"
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids))
    for p in panels(board):
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, p["title"]
    assert {v["name"] for v in board["templating"]["list"]} == {"datasource", "namespace", "job"}


def test_dashboard_queries_use_only_exported_metrics() -> None:
    board = dashboard()
    used: set[str] = set()
    for p in panels(board):
        if p["type"] == "row":
            continue
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert 'namespace="$namespace", job="$job"' in t["expr"], p["title"]
            used |= check_promql(promql_of(t["expr"]))
    for var in board["templating"]["list"][1:]:
        query = re.fullmatch(r"label_values\((.*), (\w+)\)", var["query"]["query"])
        assert query, var
        used |= check_promql(query.group(1))
        assert query.group(2) in TARGET_LABELS
    assert used == set(m.EXPORTED)  # every exported metric is on the dashboard


def test_dashboard_has_the_panels_operators_need() -> None:
    def exprs(title: str) -> str:
        found = [p for p in panels(dashboard()) if p["title"] == title]
        assert found, title
        return " ".join(t["expr"] for p in found for t in p["targets"])

    wanted = {
        "RPC rate by rpc and code": "sum by (rpc, code) (rate(agenttx_rpc_duration_seconds_count",
        "Error rate by rpc and code": 'code!="OK"',
        "Latency p50 / p99 by rpc": "histogram_quantile(0.99, sum by (rpc, le)",
        "Steps by tool and status": "sum by (tool, status) (rate(agenttx_steps_total",
        "Rollbacks by strategy": "sum by (strategy) (rate(agenttx_rollbacks_total",
        "Rollback latency p50 / p99 by strategy": "agenttx_rollback_duration_seconds_bucket",
        "etcd round trips by operation": "sum by (operation) (rate(agenttx_etcd_requests_total",
        "etcd latency p50 / p99 by operation": "agenttx_etcd_request_duration_seconds_bucket",
        "CAS conflicts by operation": "agenttx_cas_conflicts_total",
        "Outbox depth": "max(agenttx_outbox_depth",
        "Dead letters": "max(agenttx_effects_dead_letters",
        "Oldest undelivered effect": "max(agenttx_outbox_oldest_age_seconds",
        "Deliveries by channel and result": "sum by (channel, result)",
        "Open transactions": "max(agenttx_open_transactions",
        "Awaiting manual rollback": "max(agenttx_transactions_awaiting_rollback",
        "Leaders by role": "sum by (role) (agenttx_leader",
    }
    for title, fragment in wanted.items():
        assert fragment in exprs(title), title


def test_dashboard_configmap_for_the_grafana_sidecar(chart: helm_python.Chart) -> None:
    docs = render(chart, MONITORING)
    cm = one(docs, "ConfigMap", "agenttx-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == NS
    assert json.loads(cm["data"]["agenttx.json"]) == dashboard()
    other = render(chart, {"metrics": {"dashboard": {
        "enabled": True, "namespace": "grafana", "annotations": {"grafana_folder": "AgentTx"},
        "labels": {"grafana_dashboard": None, "dashboards": "agenttx"}}}})
    cm = one(other, "ConfigMap", "agenttx-dashboard")
    assert cm["metadata"]["namespace"] == "grafana"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "AgentTx"}
    assert cm["metadata"]["labels"]["dashboards"] == "agenttx"
    assert "grafana_dashboard" not in cm["metadata"]["labels"]


@pytest.mark.parametrize("variant", ["monitoring", "metrics-off"])
def test_monitoring_variants_validate(chart: helm_python.Chart, variant: str) -> None:
    for doc in render(chart, VARIANTS[variant]):
        validate(doc)
