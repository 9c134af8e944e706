"""The chart under test, rendered through the real Helm library (helm-python-sdk binds Helm's
Go SDK, so no `helm` binary and no cluster are involved), and the value sets the tests use."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "floodgate"
RELEASE = "rl"
NAMESPACE = "edge"
# The Kubernetes version the chart is linted for and its manifests validated against.
KUBE_VERSION = "1.31.0"
# Prometheus Operator kinds: no Kubernetes schema; their own tests check them.
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}

Manifest = dict[str, Any]

# Value sets a user would plausibly install with; each one is linted, rendered and validated.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "everything_enabled": {
        "replicaCount": 3,
        "image": {"repository": "registry.example.com/floodgate", "tag": "1.2.3", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "registry"}],
        "fullnameOverride": "ratelimit",
        "serviceAccount": {"annotations": {"team": "edge"}, "name": "ratelimit-sa", "automount": True},
        "backend": "redis-sentinel",
        "redis": {
            "url": "redis://sentinel-0:26379,redis://sentinel-1:26379",
            "password": "s3cret",
            "username": "floodgate",
            "sentinelMaster": "cache",
        },
        "settings": {
            "response_headers": "ietf",
            "log_format": "json",
            "redis_local_cache_size": 1000000,
            "consume_on_reject": False,
            "request_limits": {"max_descriptors": 8},
        },
        "extraEnv": [{"name": "TZ", "value": "UTC"}],
        "extraVolumes": [{"name": "redis-ca", "secret": {"secretName": "redis-ca"}}],
        "extraVolumeMounts": [{"name": "redis-ca", "mountPath": "/etc/redis-ca", "readOnly": True}],
        "tracing": {"otlpEndpoint": "http://otel-collector.observability:4317", "protocol": "grpc", "samplingRatio": 0.1},
        "service": {"type": "LoadBalancer", "grpcPort": 9081, "httpPort": 9080, "annotations": {"a": "b"}},
        "podAnnotations": {"team": "edge"},
        "podLabels": {"tier": "edge"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "edge", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "floodgate"}},
                        },
                    }
                ]
            }
        },
        "priorityClassName": "rate-limit-critical",
        "autoscaling": {"enabled": True, "targetMemoryUtilizationPercentage": 80},
        "podDisruptionBudget": {"enabled": True, "minAvailable": "50%", "maxUnavailable": None},
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}, "interval": "15s"},
        "grafanaDashboard": {
            "enabled": True,
            "label": "dashboards.example.com/grafana",
            "labelValue": "floodgate",
            "labels": {"team": "edge"},
            "annotations": {"grafana_folder": "Edge"},
        },
        "prometheusRule": {
            "enabled": True,
            "labels": {"release": "prometheus"},
            "alertLabels": {"team": "edge"},
            "alerts": {"latency": {"threshold": 0.005, "for": "15m"}, "targetDown": {"enabled": False}},
        },
        "networkPolicy": {
            "enabled": True,
            "grpcFrom": [{"podSelector": {"matchLabels": {"app": "envoy"}}}],
            "httpFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
            "egress": [
                {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]},
                {"to": [{"podSelector": {"matchLabels": {"app": "redis"}}}], "ports": [{"port": 26379}]},
            ],
        },
    },
    "existing_configmap_and_secret": {
        "backend": "redis",
        "existingConfigMap": "my-rules",
        "redis": {"existingSecret": {"name": "my-redis", "urlKey": "url", "passwordKey": "password"}},
    },
    "redis": {"backend": "redis", "redis": {"url": "rediss://redis.cache:6380/0", "password": "0123"}},
    "redis_cluster": {"backend": "redis-cluster", "redis": {"url": "redis://a:6379,redis://b:6379"}},
    "autoscaling": {"autoscaling": {"enabled": True}},
    "minimal_pod": {
        "serviceAccount": {"create": False},
        "service": {"headless": False},
        "podDisruptionBudget": {"enabled": False},
        "topologySpreadConstraints": [],
        "preStopSleepSeconds": 0,
        "listenAddress": "::",
    },
    "upstream_compat": {
        "backend": "redis",
        "upstreamCompat": {
            "enabled": True,
            "env": {"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379", "SHADOW_MODE": True},
        },
    },
}


def render(values: dict[str, Any]) -> dict[str, str]:
    """Template path -> rendered text, as `helm template rl helm/floodgate -n edge` gives."""
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(values)
        return chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)


def manifests(values: dict[str, Any]) -> list[Manifest]:
    """Every Kubernetes object the chart renders with `values` (NOTES.txt is not one)."""
    objects = []
    for path, text in sorted(render(values).items()):
        if path.endswith(".yaml"):
            objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def only(objects: list[Manifest], kind: str) -> Manifest:
    """The one object of `kind`."""
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def container_environment(objects: list[Manifest]) -> dict[str, str]:
    """The floodgate container's environment as the kubelet would set it: plain values, and
    values from the rendered Secret where the Deployment refers to one."""
    deployment = only(objects, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    secrets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
    env = {}
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
            continue
        ref = var["valueFrom"]["secretKeyRef"]
        secret = secrets.get(ref["name"])
        assert secret is not None, f"{var['name']} refers to Secret {ref['name']}, which the chart did not render"
        env[var["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
    return env


def floodgate_binary() -> Path:
    """The server under test: $FLOODGATE_BIN, else the workspace's debug build."""
    binary = Path(os.environ.get("FLOODGATE_BIN", REPO / "target" / "debug" / "floodgate"))
    if not binary.is_file():
        pytest.fail(
            f"floodgate binary not found at {binary}: run `cargo build` in {REPO} "
            "or set FLOODGATE_BIN to the binary",
            pytrace=False,
        )
    return binary
