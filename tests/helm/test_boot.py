"""The chart's configuration starts a working server: the real floodgate binary, given the
rule files of the rendered ConfigMap and the environment of the rendered Deployment (with
Secret references resolved), serves the chart's rules and answers its probes. boot_support
says what differs from a pod.
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import yaml

from boot_support import (
    OK, OVER_LIMIT, floodgate, http_status, mount_secrets, patient_with_redis, pod_files, query, three_demo_queries,
)
from chart_support import CHART, Manifest, container_environment, floodgate_binary, manifests, only


def probe_paths(objects: list[Manifest]) -> list[str]:
    (container,) = only(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    probes = [container["livenessProbe"], container["readinessProbe"]]
    assert all(probe["httpGet"]["port"] == "http" for probe in probes)
    return [probe["httpGet"]["path"] for probe in probes]


def test_default_values_start_a_server_that_applies_the_charts_rules(tmp_path: Path) -> None:
    objects = manifests({})
    env = pod_files(objects, tmp_path)
    with floodgate(env) as addresses:
        assert three_demo_queries(addresses["grpc"]) == [OK, OK, OVER_LIMIT]
        assert query(addresses["grpc"], "example", "remote_address=10.0.0.1") == OK
        for path in probe_paths(objects):
            assert http_status(addresses["http"], path) == 200, path


def test_settings_reach_the_server(tmp_path: Path) -> None:
    objects = manifests({"settings": {"response_headers": "draft03", "request_limits": {"max_descriptors": 1}}})
    env = pod_files(objects, tmp_path)
    with floodgate(env) as addresses:
        request = urllib.request.Request(
            f"http://{addresses['http']}/json",
            data=b'{"domain":"example","descriptors":['
            b'{"entries":[{"key":"generic_key","value":"demo"}]},'
            b'{"entries":[{"key":"generic_key","value":"demo"}]}]}',
            headers={"content-type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 400, "max_descriptors 1 refuses two descriptors"
        result = subprocess.run(
            [str(floodgate_binary()), "query", "--addr", f"http://{addresses['grpc']}",
             "--domain", "example", "--descriptor", "generic_key=demo"],
            capture_output=True, text=True, timeout=15,
        )
        assert "x-ratelimit-limit" in result.stdout.lower(), result.stdout


@pytest.fixture
def redis_with_password() -> Iterator[tuple[int, str]]:
    """A real redis-server on a free port that requires a password."""
    password = "0123-chart"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    try:
        server = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--requirepass", password,
             "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        pytest.fail("redis-server not found: apt-get install redis-server", pytrace=False)
    try:
        deadline = time.monotonic() + 10
        while subprocess.run(["redis-cli", "-p", str(port), "-a", password, "--no-auth-warning", "ping"],
                             capture_output=True, text=True).stdout.strip() != "PONG":
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
        yield port, password
    finally:
        server.terminate()
        server.wait()


def test_redis_url_and_password_from_the_charts_secret_reach_redis(
    tmp_path: Path, redis_with_password: tuple[int, str]
) -> None:
    port, password = redis_with_password
    objects = manifests({"backend": "redis", "redis": {"url": f"redis://127.0.0.1:{port}", "password": password}})
    env = pod_files(objects, tmp_path)
    assert "FLOODGATE_REDIS_PASSWORD" in env and password not in env["FLOODGATE_REDIS_URL"]
    patient_with_redis(env)
    with floodgate(env) as addresses:
        assert three_demo_queries(addresses["grpc"]) == [OK, OK, OVER_LIMIT]
    keys = subprocess.run(
        ["redis-cli", "-p", str(port), "-a", password, "--no-auth-warning", "--scan", "--pattern", "floodgate:*"],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    assert keys, "the counters live in Redis"


def test_upstream_compat_boots_bin_ratelimit_on_the_charts_rules_and_redis(
    tmp_path: Path, redis_with_password: tuple[int, str]
) -> None:
    port, password = redis_with_password
    upstream = {"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": f"127.0.0.1:{port}", "REDIS_AUTH": password}
    objects = manifests({"upstreamCompat": {"enabled": True, "env": upstream}})
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = container_environment(objects)
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "rules"]
    assert f"{env['RUNTIME_ROOT']}/{env['RUNTIME_APPDIRECTORY']}" == mount["mountPath"]
    rules = tmp_path / "runtime" / "rules"
    rules.mkdir(parents=True)
    for name, text in only(objects, "ConfigMap")["data"].items():
        (rules / name).write_text(text)
    env.update(RUNTIME_ROOT=str(tmp_path / "runtime"), HOST="127.0.0.1", PORT="0", GRPC_HOST="127.0.0.1", GRPC_PORT="0")
    patient_with_redis(env)
    # The image's /bin/ratelimit: the binary started under that name.
    ratelimit = tmp_path / "ratelimit"
    ratelimit.symlink_to(floodgate_binary())
    with floodgate(env, [str(ratelimit)]) as addresses:
        assert three_demo_queries(addresses["grpc"]) == [OK, OK, OVER_LIMIT]
        assert http_status(addresses["http"], "/healthcheck") == 200


@pytest.fixture
def otlp_sink() -> Iterator[tuple[str, list[bytes]]]:
    """An OTLP/HTTP receiver on a free port: its endpoint, and the bodies posted to /v1/traces."""
    import http.server
    import threading

    bodies: list[bytes] = []

    class Sink(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the handler's name)
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            if self.path == "/v1/traces" and self.headers.get("content-type") == "application/x-protobuf":
                bodies.append(body)
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", bodies
    finally:
        server.shutdown()


def test_tracing_values_make_the_server_export_its_decisions_spans(
    tmp_path: Path, otlp_sink: tuple[str, list[bytes]]
) -> None:
    endpoint, bodies = otlp_sink
    objects = manifests({"tracing": {"otlpEndpoint": endpoint}})
    env = pod_files(objects, tmp_path)
    # Export within 50 ms instead of 5 s: the test's only change to the rendered tracing.
    env["OTEL_BSP_SCHEDULE_DELAY"] = "50"
    with floodgate(env) as addresses:
        assert query(addresses["grpc"], "example", "generic_key=demo") == OK
        deadline = time.monotonic() + 15
        while not any(b"ShouldRateLimit" in body for body in bodies):
            assert time.monotonic() < deadline, f"no decision span among {len(bodies)} exports"
            time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class TlsRedis:
    """A TLS-only redis-server whose certificate a private CA signed."""

    port: int
    ca: str
    cli: list[str]

    def counter_keys(self) -> list[str]:
        keys = subprocess.run([*self.cli, "--scan", "--pattern", "floodgate:*"], capture_output=True, text=True, check=True)
        return keys.stdout.split()


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[TlsRedis]:
    """A TLS-only redis-server on a free port, its certificate (for 127.0.0.1) signed by a
    CA made here."""
    certs = tmp_path / "certs"
    certs.mkdir()

    def openssl(*arguments: str) -> None:
        result = subprocess.run(["openssl", *arguments], cwd=certs, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=floodgate-chart-test-ca",
            "-keyout", "ca.key", "-out", "ca.crt")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "server.key", "-out", "server.csr")
    (certs / "server.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "1",
            "-extfile", "server.ext", "-out", "server.crt")
    port = free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(certs / "server.crt"), "--tls-key-file", str(certs / "server.key"),
         "--tls-ca-cert-file", str(certs / "ca.crt"), "--tls-auth-clients", "no", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    redis = TlsRedis(port, (certs / "ca.crt").read_text(),
                     ["redis-cli", "--tls", "--cacert", str(certs / "ca.crt"), "-h", "127.0.0.1", "-p", str(port)])
    try:
        deadline = time.monotonic() + 10
        while subprocess.run([*redis.cli, "ping"], capture_output=True, text=True).stdout.strip() != "PONG":
            assert server.poll() is None and time.monotonic() < deadline, "redis-server with TLS did not start"
            time.sleep(0.05)
        yield redis
    finally:
        server.terminate()
        server.wait()


def readme_examples(containing: str) -> list[dict[str, Any]]:
    """The chart README's YAML value examples that mention `containing`."""
    blocks = re.findall(r"```yaml\n(.*?)```", (CHART / "README.md").read_text(), flags=re.DOTALL)
    return [yaml.safe_load(block) for block in blocks if containing in block]


@pytest.mark.parametrize(
    "example", readme_examples("extraVolumeMounts"), ids=["redis_tls_ca_file", "SSL_CERT_FILE"]
)
def test_readme_private_redis_ca_examples_reach_a_tls_redis(
    tmp_path: Path, tls_redis: TlsRedis, example: dict[str, Any]
) -> None:
    """The README's values, the URL aside: the CA in the Secret redis-ca reaches floodgate
    through the mounted volume, and floodgate counts in a Redis only that CA vouches for (a
    Redis it cannot trust would leave the counting to the rules' failure policy)."""
    values = example | {"redis": example["redis"] | {"url": f"rediss://127.0.0.1:{tls_redis.port}"}}
    objects = manifests(values)
    (tmp_path / "rules").mkdir()
    env = pod_files(objects, tmp_path / "rules")
    mount_secrets(objects, env, {"redis-ca": {"ca.crt": tls_redis.ca}}, tmp_path)
    patient_with_redis(env)
    with floodgate(env) as addresses:
        assert three_demo_queries(addresses["grpc"]) == [OK, OK, OVER_LIMIT]
    assert tls_redis.counter_keys(), "the counters live in the TLS Redis"
