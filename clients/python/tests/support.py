"""Real floodgate and redis-server processes for the tests, the server's own count of the
attempts it answered, and interceptors that count the attempts a client makes."""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import grpc
import grpc.aio
import pytest

REPO = Path(__file__).resolve().parents[3]
RULES = Path(__file__).resolve().parent / "rules"
DOMAIN = "python_client"
STARTUP_SECONDS = 15


def floodgate_binary() -> Path:
    """The server under test: $FLOODGATE_BIN, else the workspace's debug build."""
    binary = Path(os.environ.get("FLOODGATE_BIN", REPO / "target" / "debug" / "floodgate"))
    if not binary.is_file():
        pytest.fail(
            f"floodgate binary not found at {binary}: run `cargo build` at {REPO} "
            "or set FLOODGATE_BIN to the binary",
            pytrace=False,
        )
    return binary


def server_environment() -> dict[str, str]:
    """The test's environment without FLOODGATE_* variables.

    floodgate reads every FLOODGATE_* variable as a setting (and refuses unknown ones, such
    as FLOODGATE_BIN); the tests set the server's settings with flags only.
    """
    return {name: value for name, value in os.environ.items() if not name.startswith("FLOODGATE_")}


@dataclass
class Floodgate:
    """A running `floodgate serve` on free local ports; its output goes to temp files."""

    process: subprocess.Popen[bytes]
    stdout: IO[bytes]
    stderr: IO[bytes]
    grpc_target: str = ""
    #: The HTTP port (metrics, /json); it speaks HTTP/2 too, but serves no gRPC service.
    http_target: str = ""

    def requests_answered(self, code: str) -> int:
        """How many ShouldRateLimit attempts the server answered with ``code`` (``OK``,
        ``UNAVAILABLE``, ...), from its /metrics: what reached it, every retry included."""
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with direct.open(f"http://{self.http_target}/metrics", timeout=10) as page:
            text = page.read().decode()
        series = (
            f'floodgate_requests_total{{protocol="grpc",method="ShouldRateLimit",code="{code}"}} '
        )
        for line in text.splitlines():
            if line.startswith(series):
                return int(float(line[len(series) :]))
        return 0

    def freeze(self) -> None:
        """SIGSTOP: the port still accepts connections (the kernel does), nothing answers.
        Returns once the kernel reports the process stopped (the signal is delivered
        asynchronously, and a request sent in between could still be answered)."""
        stop_process(self.process)

    def kill(self) -> None:
        """SIGKILL, at once: the connections it held are reset."""
        self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        """SIGTERM, then wait for the graceful exit (the port then refuses connections)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.stdout.close()
        self.stderr.close()

    def listening_line(self) -> str | None:
        """The first stdout line once it is complete: `floodgate listening: grpc=… http=…`."""
        self.stdout.seek(0)
        line = self.stdout.readline().decode()
        return line if line.endswith("\n") else None

    def output(self) -> str:
        """Everything the process printed, for a failure message."""
        self.stdout.seek(0)
        self.stderr.seek(0)
        return (self.stdout.read() + self.stderr.read()).decode(errors="replace")


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


def start_floodgate(*extra: str, settings: Mapping[str, str] | None = None) -> Floodgate:
    """Starts floodgate on the test rules and waits until it says where it listens.

    ``settings`` are FLOODGATE_* environment variables for the server, such as
    ``{"FLOODGATE_REDIS_COMMAND_TIMEOUT_MS": "200"}``.
    """
    stdout, stderr = output_file(), output_file()
    command = [
        str(floodgate_binary()),
        "serve",
        "--rules",
        str(RULES),
        "--grpc-addr",
        "127.0.0.1:0",
        "--http-addr",
        "127.0.0.1:0",
        *extra,
    ]
    environment = {**server_environment(), **(settings or {})}
    process = subprocess.Popen(command, stdout=stdout, stderr=stderr, env=environment)
    server = Floodgate(process, stdout, stderr)
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline and server.process.poll() is None:
        line = server.listening_line()
        if line is not None and line.startswith("floodgate listening:"):
            addresses = dict(part.split("=", 1) for part in line.split()[2:])
            server.grpc_target = addresses["grpc"]
            server.http_target = addresses["http"]
            return server
        time.sleep(0.02)
    output = server.output()
    server.process.kill()
    server.stop()
    pytest.fail(f"floodgate did not start ({' '.join(command)}):\n{output}", pytrace=False)


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Redis:
    """A running redis-server on a free loopback port, without persistence."""

    process: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def freeze(self) -> None:
        """SIGSTOP: connections stay open and commands go unanswered, so floodgate's calls
        time out after its script may have run. Returns once the process is stopped."""
        stop_process(self.process)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


def start_redis() -> Redis:
    """Starts Debian's redis-server and waits until it answers PING."""
    port = free_port()
    command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    command += ["--appendonly", "no", "--logfile", "", "--dir", tempfile.gettempdir()]
    try:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except FileNotFoundError:
        pytest.fail("redis-server not found: apt-get install redis-server", pytrace=False)
    redis = Redis(process, port)
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline and process.poll() is None:
        if _pongs(port):
            return redis
        time.sleep(0.02)
    redis.stop()
    pytest.fail(f"redis-server did not answer PING on port {port}", pytrace=False)


def _pongs(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as connection:
            connection.sendall(b"PING\r\n")
            return connection.recv(7) == b"+PONG\r\n"
    except OSError:
        return False


class CountingInterceptor(grpc.UnaryUnaryClientInterceptor):
    """Records when each attempt leaves the client: what a retry test measures."""

    def __init__(self) -> None:
        self.sent_at: list[float] = []

    def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        self.sent_at.append(time.monotonic())
        return continuation(client_call_details, request)


class AsyncCountingInterceptor(grpc.aio.UnaryUnaryClientInterceptor):
    """The asyncio twin of CountingInterceptor."""

    def __init__(self) -> None:
        self.sent_at: list[float] = []

    async def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        self.sent_at.append(time.monotonic())
        return await continuation(client_call_details, request)


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """Sends SIGSTOP and waits until /proc says the process is stopped (state ``T``)."""
    process.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while True:
        stat = Path(f"/proc/{process.pid}/stat").read_text()
        if stat[stat.rindex(")") + 2 :].split()[0] == "T":
            return
        assert time.monotonic() < deadline, f"process {process.pid} did not stop"
        time.sleep(0.001)
