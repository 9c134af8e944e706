"""The chart's monitoring: the Grafana dashboard ConfigMap and the PrometheusRule render only
when asked, have the shape Grafana's sidecar and Prometheus Operator need, follow their
values, and read only metrics a booted floodgate serves on /metrics."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from typing import Any

import jsonschema
import pytest
import yaml

from boot_support import OK, OVER_LIMIT, floodgate, pod_files, three_demo_queries
from chart_support import CHART, NAMESPACE, VALUE_SETS, Manifest, manifests, only
from promql import is_served, metric_names, scraped_families

DASHBOARD = CHART / "dashboards" / "floodgate.json"
# Series no floodgate serves that the alerts read on purpose: Prometheus' own per-target
# health series.
NOT_FROM_FLOODGATE = {"up"}
GRID_COLUMNS = 24

# What Prometheus Operator needs of a PrometheusRule to load it (its CRD's required fields,
# the rule format Prometheus accepts), and what this chart promises of every alert.
PROMETHEUS_RULE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": {
            "type": "object",
            "required": ["name", "namespace"],
            "properties": {"labels": {"$ref": "#/$defs/strings"}},
        },
        "spec": {
            "type": "object",
            "required": ["groups"],
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name", "rules"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": {"$ref": "#/$defs/duration"},
                            "rules": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/alert"}},
                        },
                    },
                },
            },
        },
    },
    "$defs": {
        "duration": {
            "type": "string",
            "minLength": 1,
            "pattern": "^(0|([0-9]+y)?([0-9]+w)?([0-9]+d)?([0-9]+h)?([0-9]+m)?([0-9]+s)?([0-9]+ms)?)$",
        },
        "strings": {"type": "object", "additionalProperties": {"type": "string"}},
        "alert": {
            "type": "object",
            "required": ["alert", "expr", "for", "labels", "annotations"],
            "additionalProperties": False,
            "properties": {
                "alert": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                "expr": {"type": "string", "minLength": 1},
                "for": {"$ref": "#/$defs/duration"},
                "labels": {
                    "allOf": [{"$ref": "#/$defs/strings"}, {"required": ["severity"]}],
                    "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                },
                "annotations": {
                    "allOf": [{"$ref": "#/$defs/strings"}, {"required": ["summary", "description", "runbook"]}],
                },
            },
        },
    },
}


def rule_values(**alerts: Any) -> dict[str, Any]:
    return {"prometheusRule": {"enabled": True, "alerts": alerts}}


def alerts(objects: list[Manifest]) -> dict[str, dict[str, Any]]:
    """Alert name -> rule, over every group of the one PrometheusRule."""
    rule = only(objects, "PrometheusRule")
    found = [r for group in rule["spec"]["groups"] for r in group["rules"]]
    by_name = {r["alert"]: r for r in found}
    assert len(by_name) == len(found), "alert names repeat"
    return by_name


def dashboard_expressions(dashboard: dict[str, Any]) -> list[tuple[str, bool]]:
    """Every PromQL text in the dashboard, with whether it is a Grafana variable query."""
    found = [(t["expr"], False) for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            found.append((variable["query"]["query"], True))
            assert variable["definition"] == variable["query"]["query"]
    return found


def test_dashboard_and_alerts_are_off_by_default() -> None:
    objects = manifests({})
    assert "PrometheusRule" not in {o["kind"] for o in objects}
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "ConfigMap"] == ["rl-floodgate-rules"]


def test_dashboard_config_map_is_labelled_for_grafanas_sidecar() -> None:
    objects = manifests({"grafanaDashboard": {"enabled": True}})
    (config_map,) = [o for o in objects if o["metadata"]["name"] == "rl-floodgate-dashboard"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == NAMESPACE
    assert config_map["data"] == {"floodgate.json": DASHBOARD.read_text()}, "the JSON goes out as the chart keeps it"


def test_dashboard_label_annotations_and_namespace_follow_the_values() -> None:
    values = VALUE_SETS["everything_enabled"] | {
        "grafanaDashboard": VALUE_SETS["everything_enabled"]["grafanaDashboard"] | {"namespace": "monitoring"}
    }
    (config_map,) = [o for o in manifests(values) if o["metadata"]["name"] == "ratelimit-dashboard"]
    labels = config_map["metadata"]["labels"]
    assert labels["dashboards.example.com/grafana"] == "floodgate" and labels["team"] == "edge"
    assert "grafana_dashboard" not in labels
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "Edge"}
    assert config_map["metadata"]["namespace"] == "monitoring"


def test_dashboard_is_grafana_json_whose_panels_use_the_chosen_data_source() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "floodgate" and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert {"namespace", "job", "pod"} <= variables.keys()
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= GRID_COLUMNS, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], panel["title"]
            # Every series is narrowed to the chosen namespace, job and pods.
            for selector in re.findall(r"\b[a-z_:]+\{([^}]*)\}", target["expr"]):
                assert selector.startswith('namespace="$namespace",job="$job",pod=~"$pod"'), target["expr"]


def test_dashboard_shows_what_the_issue_asks_for() -> None:
    names = set()
    for expr, grafana in dashboard_expressions(json.loads(DASHBOARD.read_text())):
        names |= metric_names(expr, grafana=grafana)
    assert {
        "floodgate_requests_total", "floodgate_request_duration_seconds_bucket", "ratelimit_service_rate_limit_over_limit",
        "floodgate_backend_errors_total", "floodgate_backend_shed_total", "floodgate_backend_circuit_open",
        "floodgate_backend_call_duration_seconds_bucket", "floodgate_over_limit_cache_entries", "floodgate_memory_counters",
        "floodgate_memory_counters_evicted_total", "ratelimit_service_config_load_success",
        "ratelimit_service_config_load_error", "floodgate_build_info", "process_cpu_seconds_total",
        "process_resident_memory_bytes",
    } <= names


def test_prometheus_rule_has_the_fields_prometheus_operator_requires() -> None:
    rule = only(manifests(VALUE_SETS["everything_enabled"]), "PrometheusRule")
    jsonschema.validate(rule, PROMETHEUS_RULE_SCHEMA)
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    assert rule["metadata"]["namespace"] == NAMESPACE


def test_the_schema_catches_a_rule_prometheus_operator_would_refuse() -> None:
    rule = only(manifests(rule_values()), "PrometheusRule")
    broken = json.loads(json.dumps(rule))
    del broken["spec"]["groups"][0]["rules"][0]["expr"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, PROMETHEUS_RULE_SCHEMA)


def test_every_alert_key_renders_one_alert_with_its_defaults() -> None:
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())["prometheusRule"]["alerts"]
    rendered = alerts(manifests(rule_values()))
    assert len(rendered) == len(defaults)
    by_severity = sorted(r["labels"]["severity"] for r in rendered.values())
    assert by_severity == sorted(a["severity"] for a in defaults.values())
    for rule in rendered.values():
        assert all("\n" not in rule["annotations"][k] for k in ("summary", "runbook")), rule["alert"]


def test_alert_values_tune_for_severity_threshold_and_selection() -> None:
    rendered = alerts(manifests({"prometheusRule": {
        "enabled": True,
        "alertLabels": {"team": "edge", "severity": "ignored"},
        "alerts": {"latency": {"threshold": 0.05, "for": "3m", "severity": "page"}, "targetDown": {"enabled": False}},
    }}))
    latency = rendered["FloodgateLatencyHigh"]
    assert latency["expr"].rstrip().endswith("> 0.05")
    assert latency["for"] == "3m"
    assert latency["labels"] == {"severity": "page", "team": "edge"}, "an alert's own severity wins"
    assert "FloodgateTargetDown" not in rendered
    assert rendered["FloodgateShedding"]["expr"].rstrip().endswith("> 0.01"), "the others keep their defaults"


@pytest.mark.parametrize(
    ("values", "selector"),
    [
        (rule_values(), 'namespace="edge",job="rl-floodgate"'),
        (rule_values() | {"fullnameOverride": "ratelimit"}, 'namespace="edge",job="ratelimit"'),
        ({"prometheusRule": {"enabled": True, "selector": 'job="floodgate",cluster="eu-1"'}}, 'job="floodgate",cluster="eu-1"'),
    ],
    ids=["default", "fullname", "own"],
)
def test_every_series_an_alert_reads_is_narrowed_by_the_selector(values: dict[str, Any], selector: str) -> None:
    rendered = alerts(manifests(values))
    for rule in rendered.values():
        names = metric_names(rule["expr"])
        assert names, rule["alert"]
        for name in names:
            for match in re.finditer(rf"\b{name}\b(\{{[^}}]*\}})?", rule["expr"]):
                assert match.group(1) and match.group(1)[1:].startswith(selector), f"{rule['alert']}: {match.group()}"


@pytest.mark.parametrize(
    ("values", "follows"),
    [
        ({}, False),
        ({"settings": {"readiness_follows_backend": True}}, True),
        ({"upstreamCompat": {"enabled": True, "env": {"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION": "true"}}}, True),
        ({"upstreamCompat": {"enabled": True, "env": {"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION": "false"}}}, False),
    ],
    ids=["default", "setting", "upstream", "upstream_off"],
)
def test_no_ready_replica_counts_an_open_circuit_only_where_it_makes_a_pod_unready(
    values: dict[str, Any], follows: bool
) -> None:
    expr = alerts(manifests(rule_values() | values))["FloodgateNoReadyReplica"]["expr"]
    assert expr.startswith("absent(")
    assert ("floodgate_backend_circuit_open" in metric_names(expr)) == follows


def test_readme_documents_every_alert() -> None:
    readme = (CHART / "README.md").read_text()
    section = readme.split("## Alerts", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| `(\w+)` \| .* \| (`[^|]*`) \|$", section, flags=re.MULTILINE)
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())["prometheusRule"]["alerts"]
    assert [key for key, _, _ in rows] == list(defaults)
    assert {name for _, name, _ in rows} == set(alerts(manifests(rule_values())))
    for key, _, documented in rows:
        alert = defaults[key]
        expected = [alert["for"], alert["severity"]] + ([str(alert["threshold"])] if "threshold" in alert else [])
        assert documented == " / ".join(f"`{v}`" for v in expected), key


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (code) (rate(floodgate_requests_total{job="$job"}[$__rate_interval]))', {"floodgate_requests_total"}),
        ("histogram_quantile(0.99, sum by (le) (rate(a_seconds_bucket[5m]))) > 1e-05", {"a_seconds_bucket"}),
        ("absent((up{a=\"b\"} == 1) unless on (instance) (c == 1))", {"up", "c"}),
        ("time() - max by (pod) (process_start_time_seconds offset 5m)", {"process_start_time_seconds"}),
        ("x / on (pod) group_left (version) build_info", {"x", "build_info"}),
    ],
)
def test_metric_names_are_read_from_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_an_unknown_function_is_refused_not_taken_for_a_metric() -> None:
    with pytest.raises(ValueError, match="histogram_quantil"):
        metric_names("histogram_quantil(0.9, x)")


@pytest.fixture(scope="module")
def served_families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The metric families of a floodgate booted from the default chart, after requests that
    were allowed, refused over the limit, and malformed."""
    objects = manifests({})
    env = pod_files(objects, tmp_path_factory.mktemp("rules"))
    with floodgate(env) as addresses:
        assert three_demo_queries(addresses["grpc"]) == [OK, OK, OVER_LIMIT]
        malformed = urllib.request.Request(f"http://{addresses['http']}/json", data=b"{}",
                                           headers={"content-type": "application/json"})
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(malformed, timeout=5)
        with urllib.request.urlopen(f"http://{addresses['http']}/metrics", timeout=5) as response:
            return scraped_families(response.read().decode())


def used_metrics() -> dict[str, set[str]]:
    """Metric name -> where the dashboard or the alerts (everything enabled) read it."""
    used: dict[str, set[str]] = {}
    for expr, grafana in dashboard_expressions(json.loads(DASHBOARD.read_text())):
        for name in metric_names(expr, grafana=grafana):
            used.setdefault(name, set()).add("dashboard")
    for name_, rule in alerts(manifests(rule_values())).items():
        for name in metric_names(rule["expr"]):
            used.setdefault(name, set()).add(name_)
    return used


def test_every_metric_the_dashboard_and_alerts_read_is_served(served_families: dict[str, str]) -> None:
    assert served_families["floodgate_request_duration_seconds"] == "histogram"
    missing = {
        name: sorted(where) for name, where in used_metrics().items()
        if name not in NOT_FROM_FLOODGATE and not is_served(name, served_families)
    }
    assert missing == {}, f"not on floodgate's /metrics: {missing}"


def test_the_served_check_fails_for_a_metric_floodgate_lacks(served_families: dict[str, str]) -> None:
    assert not is_served("floodgate_requests", served_families)
    assert not is_served("floodgate_requests_total_bucket", served_families), "a counter has no buckets"
    assert is_served("floodgate_backend_call_duration_seconds_count", served_families)

