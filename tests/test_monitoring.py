"""The PrometheusRule and the Grafana dashboard in docker/k8s/monitoring: they render, promtool
checks the rules and unit-tests the alerts on synthetic series, the dashboard loads with its
structure intact and its queries parse, and every metric they name is one the router, the
runtime pods (engine and prober), the control plane or kube-state-metrics really exports."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from controlplane.api.metrics import control_plane_metrics
from dataplane.router.exposition import prometheus_text
from dataplane.router.metering import Meter
from dataplane.runtime.prober import ProberCounts, Status, metrics_text
from dataplane.runtime.sim import SimEngine
from engine_model.profiles import get_profile
from tests.conftest import client_for

ROOT = Path(__file__).resolve().parent.parent
MONITORING = ROOT / "docker" / "k8s" / "monitoring"
PROMTOOL = shutil.which("promtool")
KUBECTL = shutil.which("kubectl")
# Exported by kube-state-metrics, not by us: the restart counters Kubernetes keeps.
KUBE_STATE_METRICS = {"kube_pod_container_status_restarts_total", "kube_pod_container_status_waiting_reason"}
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="needs promtool (Debian's prometheus package)")


def rule_groups() -> list[dict]:
    return yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())["spec"]["groups"]


def dashboard() -> dict:
    return json.loads((MONITORING / "grafana-dashboard.json").read_text())


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


def names_in(families_text: str) -> set[str]:
    names = set()
    for family in text_string_to_metric_families(families_text):
        names.add(family.name)
        if family.type == "counter":
            names.add(family.name + "_total")
        names |= {s.name for s in family.samples}
        if family.type == "histogram":
            names |= {family.name + suffix for suffix in ("_bucket", "_sum", "_count")}
    return names


def exported() -> set[str]:
    """Every series name our processes write, from their own renderers."""
    meter = Meter(0.0)
    meter.start((7, "acme"), 0.0)
    meter.finish((7, "acme"), 0.5, 0.5, 2.0, 5, 6, False)
    meter.reject((7, "acme"), 0.6, 429)
    router = prometheus_text(meter.totals, {7: "chat"}, [(7, "pod-0", 1, 2.5, 0.5, False)])
    engine = SimEngine(get_profile("tiny-test")).render_metrics()
    prober = metrics_text(Status(True, True, "ok", 0, 1.0), ProberCounts(3, 1, 1))
    return names_in(router) | names_in(engine) | names_in(prober) | KUBE_STATE_METRICS


FUNCTIONS_AND_KEYWORDS = {
    "sum", "max", "min", "avg", "count", "rate", "increase", "irate", "delta", "histogram_quantile",
    "clamp_min", "clamp_max", "by", "without", "and", "or", "unless", "on", "ignoring", "bool",
    "group_left", "group_right", "offset", "label_values", "topk", "bottomk", "abs", "e", "inf", "nan",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression selects: identifiers, less strings, label matchers,
    grouping clauses, ranges, numbers, functions and keywords."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\$\w+", " ", text)
    names = set(re.findall(r"(?<![\w:.])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()", text))
    return {n for n in names if n.lower() not in FUNCTIONS_AND_KEYWORDS}


def test_names_are_read_from_expressions_as_promql_means_them():
    expr = (
        'sum by (endpoint, le) (rate(router_request_duration_seconds_bucket{le="10.0", x=~"a|b"}[5m])) > 0.5'
    )
    assert metric_names(expr) == {"router_request_duration_seconds_bucket"}
    assert metric_names("max by (pod) (vllm:kv_cache_usage_perc) and on (pod) up == bool 1") == {
        "vllm:kv_cache_usage_perc", "up",
    }  # fmt: skip


def test_every_metric_the_rules_and_the_dashboard_name_is_exported(db):
    known = exported() | names_in(control_plane_metrics())
    recorded = {r["record"] for g in rule_groups() for r in g["rules"] if "record" in r}
    named = set()
    for group in rule_groups():
        for rule in group["rules"]:
            named |= metric_names(rule["expr"])
    for expr in dashboard_exprs():
        named |= metric_names(expr)
    assert named - known - recorded == set()
    # what the issue asks the rules to cover, each on a real series
    alerts = " ".join(r["expr"] for g in rule_groups() for r in g["rules"])
    covered = (
        "mu_prober_hangs_total",
        "kube_pod_container_status_restarts_total",
        "router_throttled_total",
        "router_request_duration_seconds_bucket",
        "mu_benchmark_failure_streak",
    )
    for series in covered:
        assert series in alerts, series
    assert metric_names("rate(router_requests_totl[5m])") - known == {"router_requests_totl"}  # a typo fails


def test_every_alert_has_a_severity_a_summary_and_a_runbook_shipped_in_docs():
    for group in rule_groups():
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
            assert rule["annotations"]["summary"], rule["alert"]
            kind = re.fullmatch(r"/console/oncall/runbooks/(\w+)/", rule["annotations"]["runbook_url"])
            assert kind and (ROOT / "docs" / "runbooks" / f"{kind[1]}.md").is_file(), rule["alert"]


def test_the_dashboard_loads_with_its_structure_intact():
    board = dashboard()
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    assert {v["name"] for v in board["templating"]["list"]} == {"datasource", "endpoint"}
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["type"] == "timeseries" and panel["datasource"]["uid"] == "${datasource}"
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)) and all(t["expr"].strip() for t in panel["targets"])
    titles = " ".join(p["title"] for p in board["panels"])
    for shown in ("Latency p50 / p99", "429", "KV-cache", "hangs", "Restarts", "Benchmark"):
        assert shown in titles, shown


@needs_promtool
def test_promtool_checks_the_rules_and_the_dashboards_queries(tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": rule_groups()}))
    # the dashboard's queries, as recording rules: promtool parses each ($endpoint as a regex)
    queries = [
        {"record": f"dashboard:query_{i}", "expr": expr.replace("$endpoint", ".*")}
        for i, expr in enumerate(dashboard_exprs())
    ]
    board = tmp_path / "dashboard-queries.yaml"
    board.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": queries}]}))
    checked = subprocess.run(
        [PROMTOOL, "check", "rules", str(rules), str(board)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in rule_groups())} rules found" in checked.stdout


UNIT_TESTS = Path(__file__).with_name("monitoring_rules_test.yaml")


@needs_promtool
def test_promtool_unit_tests_the_alerts_on_synthetic_series(tmp_path):
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups()}))
    shutil.copy(UNIT_TESTS, tmp_path / "tests.yaml")
    tested = subprocess.run(
        [PROMTOOL, "test", "rules", "tests.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


@pytest.mark.skipif(KUBECTL is None, reason="needs kubectl (its built-in kustomize) on PATH")
def test_the_monitoring_overlay_renders_with_the_dashboard_for_grafanas_sidecar():
    rendered = subprocess.run(
        [KUBECTL, "kustomize", str(MONITORING)], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ConfigMap", "NetworkPolicy", "PodMonitor", "PodMonitor", "PodMonitor", "PrometheusRule"]
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["mu-router-runtime.json"]) == dashboard()
    runtime = next(d for d in docs if d["kind"] == "PodMonitor" and d["metadata"]["name"] == "runtime")
    assert {e["port"] for e in runtime["spec"]["podMetricsEndpoints"]} == {"engine", "probe"}


def test_the_control_plane_exports_benchmark_streaks_to_operators(operator_client, owner, small_model):
    from controlplane.capacity.models import ModelProfile

    ModelProfile.objects.filter(pk=small_model.pk).update(benchmark_failures=4)
    scrape = operator_client.get("/api/v1/metrics/")
    assert scrape.status_code == 200 and scrape["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(scrape.content.decode())
        for s in f.samples
    }
    key = (
        "mu_benchmark_failure_streak",
        (("gpu_type", small_model.gpu_type.name), ("model", small_model.model)),
    )
    assert samples[key] == 4
    assert client_for(owner).get("/api/v1/metrics/").status_code == 403
