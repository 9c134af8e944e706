"""The chart's configuration starts a working server: the real floodgate binary, given the
rule files of the rendered ConfigMap and the environment of the rendered Deployment (with
Secret references resolved), serves the chart's rules and answers its probes.

One change is made to what a pod would see: the listen addresses become 127.0.0.1:0 (the
chart's 0.0.0.0:8081 / 0.0.0.0:8080 would collide with other tests and expose the server),
and the rules directory is the temporary directory holding the ConfigMap's files instead of
the pod's mount path (the test checks the two name the same thing).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from chart_support import Manifest, container_environment, floodgate_binary, manifests, only

STARTUP_SECONDS = 15
OK, OVER_LIMIT = 0, 2


def pod_files(objects: list[Manifest], rules_dir: Path) -> dict[str, str]:
    """Writes the rules ConfigMap into `rules_dir` as the kubelet would mount it, and returns
    the container's environment pointed at that directory and at free loopback ports."""
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    config_map = only(objects, "ConfigMap")
    (volume,) = [v for v in pod["volumes"] if v.get("configMap", {}).get("name") == config_map["metadata"]["name"]]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    for name, text in config_map["data"].items():
        (rules_dir / name).write_text(text)

    env = container_environment(objects)
    assert env["FLOODGATE_RULES"] == mount["mountPath"], "the server must read the mounted ConfigMap"
    assert env["FLOODGATE_GRPC_ADDR"].endswith(":8081") and env["FLOODGATE_HTTP_ADDR"].endswith(":8080")
    env["FLOODGATE_RULES"] = str(rules_dir)
    env["FLOODGATE_GRPC_ADDR"] = "127.0.0.1:0"
    env["FLOODGATE_HTTP_ADDR"] = "127.0.0.1:0"
    return env


@contextmanager
def floodgate(env: dict[str, str], command: list[str] | None = None) -> Iterator[dict[str, str]]:
    """`floodgate serve` (the container's args), or `command`, with exactly `env`; yields its
    addresses."""
    command = command or [str(floodgate_binary()), "serve"]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=err)
        try:
            yield wait_listening(process, out, err)
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def wait_listening(process: subprocess.Popen[bytes], out: Any, err: Any) -> dict[str, str]:
    """The addresses from the first stdout line, `floodgate listening: grpc=… http=…`."""
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline and process.poll() is None:
        out.seek(0)
        line = out.readline().decode()
        if line.endswith("\n") and line.startswith("floodgate listening:"):
            return dict(part.split("=", 1) for part in line.split()[2:])
        time.sleep(0.02)
    process.kill()
    process.wait()
    out.seek(0)
    err.seek(0)
    pytest.fail(f"floodgate did not start:\n{(out.read() + err.read()).decode(errors='replace')}", pytrace=False)


def query(grpc: str, domain: str, descriptor: str) -> int:
    """One ShouldRateLimit through `floodgate query`; its exit code (0 OK, 2 over limit)."""
    result = subprocess.run(
        [str(floodgate_binary()), "query", "--addr", f"http://{grpc}", "--domain", domain, "--descriptor", descriptor],
        capture_output=True,
        text=True,
        timeout=15,
    )
    assert result.returncode in (OK, OVER_LIMIT), result.stderr
    return result.returncode


def three_demo_queries(grpc: str) -> list[int]:
    """Three queries of the chart's example rule (two a minute), started well inside one
    minute: three that straddled a minute's end would count in two windows."""
    if 60 - time.time() % 60 < 5:
        time.sleep(60 - time.time() % 60 + 0.1)
    return [query(grpc, "example", "generic_key=demo") for _ in range(3)]


def http_status(http: str, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://{http}{path}", timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


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
