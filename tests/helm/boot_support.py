"""A floodgate pod's view on this machine: the rendered chart's files written where its volumes
would be, its environment, and the real binary started with exactly that environment.

One change is made to what a pod would see: the listen addresses become 127.0.0.1:0 (the
chart's 0.0.0.0:8081 / 0.0.0.0:8080 would collide with other tests and expose the server),
and mounted files live in temporary directories instead of the pod's mount paths (the
helpers check that the environment named the mount paths, then point it at the copies).
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pytest

from chart_support import Manifest, container_environment, floodgate_binary, only

STARTUP_SECONDS = 15
OK, OVER_LIMIT = 0, 3


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


def output_file() -> IO[bytes]:
    """A temp file for a child's output that the test rereads while the child writes.

    The child's descriptor shares this file's offset: a `seek(0)` to reread would move the
    child's next write to the start, over the first lines it wrote (the listening line, say).
    O_APPEND makes every write land at the end, wherever the offset stands.
    """
    file = tempfile.TemporaryFile()
    flags = fcntl.fcntl(file.fileno(), fcntl.F_GETFL)
    fcntl.fcntl(file.fileno(), fcntl.F_SETFL, flags | os.O_APPEND)
    return file


@contextmanager
def floodgate(env: dict[str, str], command: list[str] | None = None) -> Iterator[dict[str, str]]:
    """`floodgate serve` (the container's args), or `command`, with exactly `env`; yields its
    addresses."""
    command = command or [str(floodgate_binary()), "serve"]
    with output_file() as out, output_file() as err:
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


def patient_with_redis(env: dict[str, str]) -> None:
    """Gives Redis calls 2 s instead of the 15 ms default: these tests are about where the
    settings lead, not speed, and the debug binary on a busy two-core machine can outlast
    15 ms, which would hand the request to its failure policy and fail the test at random."""
    env["FLOODGATE_REDIS_COMMAND_TIMEOUT_MS"] = "2000"


def mount_secrets(objects: list[Manifest], env: dict[str, str], secrets: dict[str, dict[str, str]], root: Path) -> None:
    """Writes the files of the container's Secret volumes (`secrets`: Secret name -> key ->
    text, Secrets the user made beside the release) under `root` as the kubelet would mount
    them, and points every variable of `env` that names a file under a mount path at the copy.
    Fails unless each of `secrets` is mounted and named by some variable."""
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounted = set()
    for mount in container["volumeMounts"]:
        secret = volumes[mount["name"]].get("secret")
        if secret is None:
            continue
        mounted.add(secret["secretName"])
        directory = root / mount["name"]
        directory.mkdir()
        for key, text in secrets[secret["secretName"]].items():
            (directory / key).write_text(text)
        prefix = mount["mountPath"].rstrip("/") + "/"
        named = [name for name, value in env.items() if value.startswith(prefix)]
        assert named, f"no variable names a file under {mount['mountPath']}: {env}"
        for name in named:
            env[name] = str(directory / env[name][len(prefix):])
    assert mounted == secrets.keys(), f"mounted Secrets {mounted}, expected {set(secrets)}"
