"""The chart lints strictly, renders valid Kubernetes objects for every value set, and its
schema refuses values it does not know."""

from __future__ import annotations

import re
import tomllib
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from chart_support import CHART, CRD_KINDS, KUBE_VERSION, NAMESPACE, REPO, VALUE_SETS, manifests, only, render

WARNING = 2


@pytest.mark.parametrize("name", VALUE_SETS)
def test_chart_lints_strictly(name: str) -> None:
    report = helm.lint(CHART, VALUE_SETS[name], strict=True, namespace=NAMESPACE, kube_version=f"v{KUBE_VERSION}")
    problems = [m for m in report["messages"] if m["severity"] >= WARNING]
    assert report["errors"] == [] and problems == [], report


@pytest.mark.parametrize("name", VALUE_SETS)
def test_rendered_objects_are_valid_kubernetes(name: str) -> None:
    objects = manifests(VALUE_SETS[name])
    assert objects
    for manifest in objects:
        if manifest["kind"] in CRD_KINDS:
            # The ServiceMonitor is checked against the Service in
            # test_service_monitor_scrapes_the_http_port, the PrometheusRule in
            # test_observability.py.
            continue
        try:
            kubernetes_validate.validate(manifest, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(p) for p in error.path)
            pytest.fail(f"{manifest['kind']}/{manifest['metadata']['name']}: {path}: {error.message}")
        assert manifest["metadata"]["namespace"] == NAMESPACE


def test_defaults_render_the_core_objects_only() -> None:
    kinds = sorted(o["kind"] for o in manifests({}))
    assert kinds == ["ConfigMap", "Deployment", "PodDisruptionBudget", "Service", "Service", "ServiceAccount"]


def test_everything_enabled_renders_every_optional_object() -> None:
    kinds = {o["kind"] for o in manifests(VALUE_SETS["everything_enabled"])}
    assert {
        "HorizontalPodAutoscaler", "PodDisruptionBudget", "ServiceMonitor", "PrometheusRule", "NetworkPolicy", "Secret",
    } <= kinds


def test_pods_run_non_root_on_a_read_only_root_without_capabilities() -> None:
    pod = only(manifests({}), "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_termination_grace_covers_the_pre_stop_sleep_and_shutdown_grace() -> None:
    pod = only(manifests({"shutdownGrace": 30, "preStopSleepSeconds": 7}), "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["FLOODGATE_SHUTDOWN_GRACE"] == "30"
    assert container["lifecycle"]["preStop"] == {"sleep": {"seconds": 7}}
    assert pod["terminationGracePeriodSeconds"] > 30 + 7


def test_autoscaling_leaves_the_replica_count_to_the_autoscaler() -> None:
    objects = manifests({"autoscaling": {"enabled": True, "minReplicas": 3, "maxReplicas": 9}})
    assert "replicas" not in only(objects, "Deployment")["spec"]
    hpa = only(objects, "HorizontalPodAutoscaler")["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (3, 9)
    assert hpa["scaleTargetRef"]["name"] == only(objects, "Deployment")["metadata"]["name"]


def test_topology_spread_selects_the_charts_pods() -> None:
    deployment = only(manifests({}), "Deployment")
    selector = deployment["spec"]["selector"]["matchLabels"]
    constraints = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert [c["topologyKey"] for c in constraints] == ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]
    assert all(c["labelSelector"]["matchLabels"] == selector for c in constraints)


def test_service_monitor_scrapes_the_http_port() -> None:
    objects = manifests(VALUE_SETS["everything_enabled"])
    monitor = only(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    selected = [
        s for s in objects
        if s["kind"] == "Service"
        and monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
    ]
    assert selected
    for service in selected:
        http = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
        assert http == [] or http[0]["targetPort"] == "http"
    assert any(p["name"] == "http" for s in selected for p in s["spec"]["ports"])


def test_redis_url_and_password_come_from_the_charts_secret() -> None:
    objects = manifests(VALUE_SETS["redis"])
    secret = only(objects, "Secret")
    (container,) = only(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e}
    assert refs["FLOODGATE_REDIS_URL"]["name"] == secret["metadata"]["name"]
    assert refs["FLOODGATE_REDIS_PASSWORD"]["name"] == secret["metadata"]["name"]
    assert "0123" not in yaml.safe_dump(only(objects, "Deployment"))


def test_existing_config_map_and_secret_are_used_and_not_made() -> None:
    objects = manifests(VALUE_SETS["existing_configmap_and_secret"])
    kinds = {o["kind"] for o in objects}
    assert "ConfigMap" not in kinds and "Secret" not in kinds
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["volumes"][0]["configMap"]["name"] == "my-rules"
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in pod["containers"][0]["env"] if "valueFrom" in e}
    assert refs == {
        "FLOODGATE_REDIS_URL": {"name": "my-redis", "key": "url"},
        "FLOODGATE_REDIS_PASSWORD": {"name": "my-redis", "key": "password"},
    }


def test_redis_backend_without_a_url_fails_to_render() -> None:
    with pytest.raises(helm.HelmError, match="needs redis.url"):
        render({"backend": "redis"})


def test_settings_become_floodgate_environment_variables() -> None:
    (container,) = only(manifests(VALUE_SETS["everything_enabled"]), "Deployment")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["FLOODGATE_RESPONSE_HEADERS"] == "ietf"
    assert env["FLOODGATE_REDIS_LOCAL_CACHE_SIZE"] == "1000000"
    assert env["FLOODGATE_CONSUME_ON_REJECT"] == "false"
    assert env["FLOODGATE_REQUEST_LIMITS__MAX_DESCRIPTORS"] == "8"
    assert env["FLOODGATE_REDIS_SENTINEL_MASTER"] == "cache"


def test_tracing_values_become_the_standard_otel_variables_and_are_off_by_default() -> None:
    (container,) = only(manifests(VALUE_SETS["everything_enabled"]), "Deployment")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability:4317"
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc"
    assert (env["OTEL_TRACES_SAMPLER"], env["OTEL_TRACES_SAMPLER_ARG"]) == ("parentbased_traceidratio", "0.1")
    (default,) = only(manifests({}), "Deployment")["spec"]["template"]["spec"]["containers"]
    assert not any(e["name"].startswith("OTEL_") for e in default["env"])


@pytest.mark.parametrize(
    "values",
    [
        {"replicaCont": 3},
        {"image": {"tagg": "1.0"}},
        {"autoscaling": {"enabled": True, "maxReplica": 5}},
        {"backend": "redis-clustr"},
        {"settings": {"grpc_addr": "0.0.0.0:1"}},
        {"settings": {"Response-Headers": "ietf"}},
        {"rules": {"limits.json": "domain: x"}},
        {"serviceMonitor": {"enabled": True, "interval": "often"}},
        {"tracing": {"otlpEndpoint": "otel-collector:4318"}},
        {"tracing": {"protocol": "http/json"}},
        {"tracing": {"samplingRatio": 1.5}},
        {"extraVolumeMounts": [{"name": "redis-ca"}]},
        {"grafanaDashboard": {"enabled": True, "labelValue": 1}},
        {"prometheusRule": {"alerts": {"latncy": {"enabled": False}}}},
        {"prometheusRule": {"alerts": {"latency": {"threshold": "10ms"}}}},
        {"prometheusRule": {"alerts": {"shedding": {"threshold": 5}}}},
        {"prometheusRule": {"alerts": {"targetDown": {"for": "five minutes"}}}},
        {"prometheusRule": {"alerts": {"targetDown": {"for": "5m1h"}}}},
        {"prometheusRule": {"selector": '{job="floodgate"}'}},
    ],
    ids=lambda values: yaml.safe_dump(values, default_flow_style=True).strip(),
)
def test_schema_refuses_unknown_or_invalid_values(values: dict[str, Any]) -> None:
    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmValuesError):
            chart.validate_schema(values)
    report = helm.lint(CHART, values, strict=True, kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] or any(m["severity"] >= WARNING for m in report["messages"]), report


def test_readme_documents_every_value() -> None:
    readme = (CHART / "README.md").read_text()
    documented = set(re.findall(r"^\| `([^`]+)` \|", readme, flags=re.MULTILINE))
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    missing = [key for key in value_paths(defaults) if key not in documented]
    assert missing == []


def value_paths(values: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths of the values, stopping at free-form maps the README describes whole."""
    whole = {
        "rules", "settings", "podSecurityContext", "securityContext", "resources", "livenessProbe", "readinessProbe",
        "prometheusRule.alerts",  # a table of its own, checked by test_readme_documents_every_alert
    }
    paths = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and path not in whole:
            paths.extend(value_paths(value, f"{path}."))
        else:
            paths.append(path)
    return paths


def test_upstream_compat_runs_bin_ratelimit_with_upstreams_variables_and_no_redis_secret() -> None:
    objects = manifests(VALUE_SETS["upstream_compat"])
    assert "Secret" not in {o["kind"] for o in objects}, "the chart's Redis values are not used"
    (container,) = only(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["/bin/ratelimit"] and "args" not in container
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["REDIS_URL"] == "redis:6379" and env["SHADOW_MODE"] == "true"
    assert (env["RUNTIME_ROOT"], env["RUNTIME_APPDIRECTORY"]) == ("/etc/floodgate", "rules")
    assert not any(name.startswith("FLOODGATE_REDIS") for name in env)


def test_notes_tell_envoy_where_the_grpc_service_is() -> None:
    notes = render({})["floodgate/templates/NOTES.txt"]
    assert f"rl-floodgate.{NAMESPACE}.svc.cluster.local:8081" in notes
    assert "envoy.filters.http.ratelimit" in notes
    assert "cluster_name: floodgate" in notes
    assert "socket_address: { address: rl-floodgate-headless.edge.svc.cluster.local, port_value: 8081 }" in notes


def test_chart_metadata_matches_the_crate() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    crate = tomllib.loads((REPO / "Cargo.toml").read_text())["package"]
    assert chart["appVersion"] == crate["version"], "the image tag defaults to appVersion"
    assert chart["annotations"]["artifacthub.io/license"] == crate["license"]
    assert chart["maintainers"] and all(m["name"] for m in chart["maintainers"])
    assert chart["kubeVersion"] and chart["description"] and chart["keywords"]

