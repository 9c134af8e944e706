"""A real floodgate process for the tests, and interceptors that count attempts."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
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

    def stop(self) -> None:
        """SIGTERM, then wait for the graceful exit (the port then refuses connections)."""
        if self.process.poll() is None:
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


def start_floodgate(*extra: str) -> Floodgate:
    """Starts floodgate on the test rules and waits until it says where it listens."""
    stdout, stderr = tempfile.TemporaryFile(), tempfile.TemporaryFile()
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
    process = subprocess.Popen(command, stdout=stdout, stderr=stderr, env=server_environment())
    server = Floodgate(process, stdout, stderr)
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline and server.process.poll() is None:
        line = server.listening_line()
        if line is not None and line.startswith("floodgate listening:"):
            addresses = dict(part.split("=", 1) for part in line.split()[2:])
            server.grpc_target = addresses["grpc"]
            return server
        time.sleep(0.02)
    output = server.output()
    server.process.kill()
    server.stop()
    pytest.fail(f"floodgate did not start ({' '.join(command)}):\n{output}", pytrace=False)


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
