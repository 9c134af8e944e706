"""A network and mount namespace of the test's own, standing in for a container network: the
image's fixed ports (8081, 8080, Envoy's 10000, Redis' 6379) are free in it whatever runs on
the machine, mounts made in it (an image root made read-only, a volume, an /etc/hosts naming
the compose services) are seen only by the processes started in it, and everything in it is
gone when the test ends. Needs root (unshare, nsenter, mount, chroot)."""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pytest

STARTUP_SECONDS = 30
# The address a container has on its network, not a loopback one: a server that listened on
# loopback only would be unreachable at it, as from another container.
ADDRESS = "10.89.0.2"

# Run by the test's Python inside the namespace: one HTTP request, its answer as JSON.
HTTP_CLIENT = """
import json, sys, urllib.error, urllib.request
method, url, headers, body = json.loads(sys.argv[1])
request = urllib.request.Request(url, data=body.encode() if body is not None else None,
                                 headers=headers, method=method)
try:
    with urllib.request.urlopen(request, timeout=10) as response:
        status, head, text = response.status, dict(response.headers), response.read().decode()
except urllib.error.HTTPError as error:
    status, head, text = error.code, dict(error.headers), error.read().decode()
print(json.dumps({"status": status, "headers": {k.lower(): v for k, v in head.items()}, "body": text}))
"""


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the image's root is entered with chroot and its ports live in a network namespace")


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


class Sandbox:
    """The namespaces, held open by a sleeping process; commands join them with nsenter."""

    def __init__(self, holder: subprocess.Popen[bytes]) -> None:
        self.holder = holder
        self.processes: list[tuple[subprocess.Popen[bytes], IO[bytes], IO[bytes]]] = []

    def enter(self, command: list[str]) -> list[str]:
        return ["nsenter", f"--target={self.holder.pid}", "--net", "--mount", "--", *command]

    def run(self, command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.enter(command), capture_output=True, text=True, timeout=30, **kwargs)

    def start(self, command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """A long-running process in the namespaces with exactly `env`; stopped at the end."""
        out, err = output_file(), output_file()
        process = subprocess.Popen(self.enter(command), env=env, stdout=out, stderr=err)
        self.processes.append((process, out, err))
        return process

    def output(self, process: subprocess.Popen[bytes]) -> str:
        (out, err) = next((o, e) for p, o, e in self.processes if p is process)
        out.seek(0)
        err.seek(0)
        return (out.read() + err.read()).decode(errors="replace")

    def wait_for_line(self, process: subprocess.Popen[bytes], prefix: str) -> str:
        """The first stdout line starting with `prefix`, once the process has written it."""
        (out, _) = next((o, e) for p, o, e in self.processes if p is process)
        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline and process.poll() is None:
            out.seek(0)
            for line in out.read().decode(errors="replace").splitlines(keepends=True):
                if line.startswith(prefix) and line.endswith("\n"):
                    return line.strip()
            time.sleep(0.05)
        pytest.fail(f"no {prefix!r} line from {process.args}:\n{self.output(process)}", pytrace=False)

    def wait_until(self, what: str, ready: Any, process: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline and process.poll() is None:
            if ready():
                return
            time.sleep(0.1)
        pytest.fail(f"{what} not ready:\n{self.output(process)}", pytrace=False)

    def http(
        self, method: str, url: str, headers: dict[str, str] | None = None, body: str | None = None
    ) -> dict[str, Any]:
        """One HTTP request made from inside the namespaces: status, headers (lower-cased), body."""
        request = json.dumps([method, url, headers or {}, body])
        result = self.run([sys.executable, "-c", HTTP_CLIENT, request])
        if result.returncode != 0:
            return {"status": None, "headers": {}, "body": result.stderr}
        return json.loads(result.stdout)

    def stop(self) -> None:
        for process, out, err in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            out.close()
            err.close()
        self.holder.kill()
        self.holder.wait()


def sh_quote(command: list[str]) -> str:
    return " ".join(shlex.quote(word) for word in command)


@contextmanager
def sandbox(
    hosts: dict[str, str],
    roots: list[Path] = (),
    read_only: bool = False,
    binds: list[tuple[Path, Path]] = (),
) -> Iterator[Sandbox]:
    """New namespaces with loopback up, ADDRESS for the containers, an /etc/hosts naming
    `hosts` (name -> address),
    for this machine's programs and, as a container engine gives each container its own, for
    each of `roots` (image root filesystems); the roots made read-only in place when
    `read_only` (a container's `read_only: true`); then each of `binds` (host path, path to
    mount it on) mounted read-only (a `:ro` volume)."""
    with tempfile.NamedTemporaryFile("w", suffix=".hosts") as hosts_file:
        hosts_file.write("127.0.0.1\tlocalhost\n")
        hosts_file.writelines(f"{address}\t{name}\n" for name, address in hosts.items())
        hosts_file.flush()
        # Readable by the image's user, as a container engine's /etc/hosts is.
        os.chmod(hosts_file.name, 0o644)
        setup = [["ip", "link", "set", "lo", "up"], ["ip", "address", "add", f"{ADDRESS}/32", "dev", "lo"]]
        # Read-only first: a bind of a directory onto itself would hide mounts made below it.
        for root in roots if read_only else ():
            setup += [["mount", "--bind", str(root), str(root)], ["mount", "-o", "remount,bind,ro", str(root)]]
        for etc in ["/etc", *(f"{root}/etc" for root in roots)]:
            setup.append(["mount", "--bind", hosts_file.name, f"{etc}/hosts"])
        for source, target in binds:
            setup += [["mount", "--bind", str(source), str(target)], ["mount", "-o", "remount,bind,ro", str(target)]]
        script = "set -e; " + "; ".join(sh_quote(c) for c in setup) + "; echo ready; exec sleep 600"
        holder = subprocess.Popen(
            ["unshare", "--net", "--mount", "--propagation", "private", "sh", "-c", script],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert holder.stdout is not None
        if holder.stdout.readline() != b"ready\n":
            holder.kill()
            _, err = holder.communicate()
            pytest.fail(f"could not set up the namespaces: {err.decode(errors='replace')}", pytrace=False)
        box = Sandbox(holder)
        try:
            yield box
        finally:
            box.stop()
