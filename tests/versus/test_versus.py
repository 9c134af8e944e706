"""``scripts/versus.sh`` keeps working: floodgate and Limitador, each built from source, loaded
for a second a point by the same load generator, on both backends, closed and open loop.

Needs Limitador's server: ``LIMITADOR_BIN``, or ``FLOODGATE_VERSUS=1`` to build it with
``../shared/tools/build-limitador`` (12-22 minutes on 2 cores; CI's run sets it). The
servers are ``FLOODGATE_BIN`` (the suite's debug build) and the load generator
``LOADGEN_BIN`` (the suite's debug floodgate-bench unless set), so the test adds no release
build.
"""

from __future__ import annotations

import csv
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD_LIMITADOR = REPO.parent / "shared" / "tools" / "build-limitador"


def limitador() -> str | None:
    if os.environ.get("LIMITADOR_BIN"):
        return os.environ["LIMITADOR_BIN"]
    if os.environ.get("FLOODGATE_VERSUS") == "1":
        built = subprocess.run(
            [str(BUILD_LIMITADOR)], check=True, capture_output=True, text=True
        )
        return built.stdout.strip().splitlines()[-1]
    return None


@pytest.fixture(scope="module")
def versus(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, str]], str]:
    binary = limitador()
    if binary is None:
        pytest.skip("no Limitador: set LIMITADOR_BIN, or FLOODGATE_VERSUS=1 to build it")
    floodgate = os.environ.get("FLOODGATE_BIN", str(REPO / "target" / "debug" / "floodgate"))
    out = tmp_path_factory.mktemp("versus") / "versus.tsv"
    env = dict(
        os.environ,
        LIMITADOR_BIN=binary,
        FLOODGATE_BIN=floodgate,
        LOADGEN_BIN=os.environ.get("LOADGEN_BIN", floodgate + "-bench"),
        CORES=f"1 {os.cpu_count()}",
        BACKENDS="memory redis",
        DESCRIPTORS="1 5",
        CONCURRENCIES="8 32",
        OPEN_SHARES="0.05",
        REPS="1",
        DURATION="1",
        WARMUP="0",
        OUT=str(out),
        PORT_BASE="19100",
        REDIS_PORT="19479",
    )
    run = subprocess.run(
        ["bash", str(REPO / "scripts" / "versus.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    with out.open() as rows:
        return list(csv.DictReader(rows, delimiter="\t")), run.stdout


def test_every_point_has_a_row_from_each_server_with_decisions(versus) -> None:
    rows, _ = versus
    points = {
        (r["cores"], r["backend"], r["descriptors"], r["mode"], r["concurrency"] or r["offered_rps"])
        for r in rows
    }
    # Two core counts (or one, on a one-core machine) × two backends × two descriptor
    # counts × (two closed-loop concurrencies + one open-loop rate).
    cores = {"1", str(os.cpu_count())}
    assert len(points) == len(cores) * 2 * 2 * 3, sorted(points)
    for point in points:
        servers = {
            r["server"]: r
            for r in rows
            if (r["cores"], r["backend"], r["descriptors"], r["mode"], r["concurrency"] or r["offered_rps"])
            == point
        }
        assert set(servers) == {"floodgate", "limitador"}, point
        for server, row in servers.items():
            assert float(row["decided_per_s"]) > 0, (server, point, row)
            assert float(row["p99_ms"]) > 0, (server, point, row)
            assert row["server_us_per_decision"], (server, point, row)
            if point[1] == "redis":
                assert row["redis_us_per_decision"], (server, point, row)
                assert float(row["redis_cmds_per_decision"]) > 0, (server, point, row)


def test_both_servers_decided_without_failures(versus) -> None:
    rows, _ = versus
    for row in rows:
        failed = sum(float(row[c]) for c in ("shed_per_s", "unavailable_per_s", "errors_per_s"))
        assert failed <= 0.01 * float(row["decided_per_s"]), row


def test_the_ratios_name_every_point(versus) -> None:
    rows, stdout = versus
    lines = [line for line in stdout.splitlines() if line.count("\t") >= 8]
    header, ratios = lines[0], lines[1:]
    assert header.split("\t")[:4] == ["cores", "backend", "descriptors", "load"]
    points = {(r["cores"], r["backend"], r["descriptors"], r["mode"], r["concurrency"] or r["offered_rps"]) for r in rows}
    assert len(ratios) == len(points), ratios
    for line in ratios:
        ratio = line.split("\t")[5]
        assert float(ratio) > 0, line
