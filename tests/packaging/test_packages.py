"""The three client packages build from a clean clone and work once installed.

A clean clone (``git clone`` of the committed HEAD, so nothing untracked or ignored helps)
packages the Rust crate with verification (cargo builds the packed crate on its own), builds
the Python sdist, a wheel from the checkout and a wheel from the sdist alone, and packs the
npm tarball. Each result is opened and installed where it can be: the wheel into a fresh
venv, the tarball into a fresh npm project through both ``require`` and ``import``.

Needs git, cargo (the crate's dependencies already in cargo's cache: the workspace build has
fetched them, and the package is built ``--offline``), a Python with ``pip`` and ``build``,
npm, and PyPI and npm registries for the build tools and the installed dependencies.
``FLOODGATE_PACKAGING_TARGET_DIR`` sets where the crate's verification build goes (by
default target/packaging, kept between runs so a second run rebuilds only the crate).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LICENSE = (REPO / "LICENSE").read_bytes()
SERVICE_PROTO = "envoy/service/ratelimit/v3/rls.proto"
# `import "a/b.proto";` (also `import public` and `import weak`), one per line.
PROTO_IMPORT = re.compile(r'^\s*import\s+(?:public\s+|weak\s+)?"([^"]+)"\s*;', re.MULTILINE)
CLIENTS = ("rust", "python", "typescript")
# A port nothing listens on: the installed clients reach the network layer and fail there.
CLOSED_TARGET = "127.0.0.1:9"


def run(args: list[str | Path], cwd: Path, env: dict[str, str] | None = None) -> str:
    """Runs a command to completion and returns its stdout; a failure shows all its output."""
    done = subprocess.run(
        [str(arg) for arg in args],
        check=False,
        cwd=cwd,
        env=None if env is None else {**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        pytest.fail(
            f"{' '.join(map(str, args))} exited {done.returncode} in {cwd}\n"
            f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
        )
    return done.stdout


def service_protos(root: Path) -> list[str]:
    """The RLS service's proto file and every file under ``root`` it imports, directly or not."""
    found: set[str] = set()
    pending = [SERVICE_PROTO]
    while pending:
        name = pending.pop()
        if name in found or not (root / name).is_file():
            continue
        found.add(name)
        pending.extend(PROTO_IMPORT.findall((root / name).read_text()))
    return sorted(found)


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh clone of the repository's committed HEAD."""
    path = tmp_path_factory.mktemp("clone") / "floodgate"
    run(["git", "clone", "--quiet", REPO, path], cwd=REPO)
    return path


# The working tree: checks that need no clone and fail as soon as a copy drifts.


def test_the_rust_client_compiles_exact_copies_of_the_repository_protos() -> None:
    copies = REPO / "clients" / "rust" / "proto"
    wanted = service_protos(REPO / "proto")
    held = sorted(str(path.relative_to(copies)) for path in copies.rglob("*") if path.is_file())
    assert held == wanted, "clients/rust/proto holds the RLS protos and their imports, only them"
    for name in wanted:
        assert (copies / name).read_bytes() == (REPO / "proto" / name).read_bytes(), (
            f"clients/rust/proto/{name} differs from proto/{name}: copy it again"
        )


@pytest.mark.parametrize("client", CLIENTS)
def test_each_client_ships_the_repository_licence(client: str) -> None:
    assert (REPO / "clients" / client / "LICENSE").read_bytes() == LICENSE


# Rust: cargo package builds the packed crate alone, as crates.io would.


def test_the_rust_crate_packages_and_builds_on_its_own(clone: Path) -> None:
    target = Path(os.environ.get("FLOODGATE_PACKAGING_TARGET_DIR", REPO / "target" / "packaging"))
    run(
        ["cargo", "package", "-p", "floodgate-client", "--locked", "--offline"],
        cwd=clone,
        env={"CARGO_TARGET_DIR": str(target)},
    )
    manifest = tomllib.loads((clone / "clients" / "rust" / "Cargo.toml").read_text())
    version = manifest["package"]["version"]
    crate = target / "package" / f"floodgate-client-{version}.crate"
    prefix = f"floodgate-client-{version}/"
    with tarfile.open(crate) as archive:
        names = {member.name.removeprefix(prefix) for member in archive.getmembers()}
        licence = archive.extractfile(prefix + "LICENSE")
        assert licence is not None and licence.read() == LICENSE
    for name in ["Cargo.toml", "build.rs", "README.md", "src/lib.rs"]:
        assert name in names, f"{name} is packaged"
    assert sorted(name for name in names if name.startswith("proto/")) == [
        f"proto/{name}" for name in service_protos(clone / "proto")
    ]
    assert not [name for name in names if name.startswith("tests/")]
    assert crate.stat().st_size < 100_000


# Python: an sdist, a wheel from the checkout and a wheel from the sdist alone.


@pytest.fixture(scope="module")
def python_dists(clone: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist, the wheel `pip wheel` builds from the clone, and the one built from the sdist."""
    out = tmp_path_factory.mktemp("python")
    run(
        [sys.executable, "-m", "build", "--sdist", "--outdir", out / "sdist", "clients/python"],
        clone,
    )
    (sdist,) = (out / "sdist").glob("*.tar.gz")
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir"]
    run([*pip_wheel, out / "from-checkout", "clients/python"], clone)
    # From the tarball itself: pip unpacks it in a directory of its own, away from proto/.
    run([*pip_wheel, out / "from-sdist", sdist], out)
    (from_checkout,) = (out / "from-checkout").glob("*.whl")
    (from_sdist,) = (out / "from-sdist").glob("*.whl")
    return {"sdist": sdist, "from_checkout": from_checkout, "from_sdist": from_sdist}


def test_the_python_sdist_carries_the_protos_and_the_licence_and_no_tests(
    clone: Path, python_dists: dict[str, Path]
) -> None:
    with tarfile.open(python_dists["sdist"]) as archive:
        root = archive.getnames()[0].split("/")[0]
        names = {name.removeprefix(f"{root}/") for name in archive.getnames()}
        licence = archive.extractfile(f"{root}/LICENSE")
        assert licence is not None and licence.read() == LICENSE
    protos = sorted(name for name in names if name.endswith(".proto"))
    assert protos == [f"proto/{name}" for name in service_protos(clone / "proto")]
    assert not [name for name in names if name.startswith("tests")]


def test_a_wheel_built_from_the_sdist_alone_matches_the_one_from_the_checkout(
    python_dists: dict[str, Path],
) -> None:
    def contents(wheel: Path) -> set[str]:
        with zipfile.ZipFile(wheel) as archive:
            return {name for name in archive.namelist() if not name.endswith("/RECORD")}

    assert contents(python_dists["from_sdist"]) == contents(python_dists["from_checkout"])


def test_the_wheel_declares_its_licence(python_dists: dict[str, Path]) -> None:
    with zipfile.ZipFile(python_dists["from_sdist"]) as archive:
        dist_info = next(
            name.split("/")[0] for name in archive.namelist() if ".dist-info/" in name
        )
        metadata = Parser().parsestr(archive.read(f"{dist_info}/METADATA").decode())
        assert archive.read(f"{dist_info}/licenses/LICENSE") == LICENSE
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata["License-File"] == "LICENSE"


INSTALLED_PYTHON_PROBE = f"""
import grpc
import floodgate_client
from floodgate_client._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

request = rls_pb2.RateLimitRequest(domain="probe", hits_addend=1)
request.descriptors.add().entries.add(key="user_id", value="alice")
assert rls_pb2.RateLimitRequest.FromString(request.SerializeToString()) == request
stub = rls_pb2_grpc.RateLimitServiceStub(grpc.insecure_channel("{CLOSED_TARGET}"))
try:
    stub.ShouldRateLimit(request, timeout=2)
except grpc.RpcError as error:
    print(error.code().name, floodgate_client.Client.__name__)
"""


def test_the_wheel_installs_into_a_fresh_venv_and_its_generated_stub_runs(
    python_dists: dict[str, Path], tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv], tmp_path)
    python = venv / "bin" / "python"
    run([python, "-m", "pip", "install", "--quiet", python_dists["from_sdist"]], tmp_path)
    output = run([python, "-c", INSTALLED_PYTHON_PROBE], tmp_path)
    assert output.split() == ["UNAVAILABLE", "Client"]


# npm: the tarball `npm pack` makes after `npm ci` in the clone.


@dataclass(frozen=True)
class NpmTarball:
    path: Path
    files: frozenset[str]


@pytest.fixture(scope="module")
def npm_tarball(clone: Path, tmp_path_factory: pytest.TempPathFactory) -> NpmTarball:
    """The tarball `npm pack` makes after `npm ci` (which builds the package) in the clone."""
    package = clone / "clients" / "typescript"
    out = tmp_path_factory.mktemp("npm")
    run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], package)
    (packed,) = json.loads(run(["npm", "pack", "--json", "--pack-destination", out], package))
    files = frozenset(entry["path"] for entry in packed["files"])
    return NpmTarball(out / packed["filename"], files)


def test_the_npm_tarball_carries_both_entries_the_protos_and_the_licence(
    clone: Path, npm_tarball: NpmTarball
) -> None:
    files = npm_tarball.files
    for name in [
        "dist/index.js",
        "dist/index.d.ts",
        "dist/index.mjs",
        "dist/index.d.mts",
        "LICENSE",
    ]:
        assert name in files, f"{name} is packed"
    assert sorted(name for name in files if name.startswith("proto/")) == [
        f"proto/{name}" for name in service_protos(clone / "proto")
    ]
    assert not [name for name in files if name.split("/")[0] in {"src", "test", "scripts"}]
    with tarfile.open(npm_tarball.path) as archive:
        licence = archive.extractfile("package/LICENSE")
        assert licence is not None and licence.read() == LICENSE


# Both module systems, in one program: the same class either way, and a client that loads
# the packed protos and reaches the network (a closed port, so the call fails open).
INSTALLED_NPM_PROBE = f"""
import {{ createRequire }} from "node:module";
import {{ FloodgateClient, FloodgateError }} from "floodgate-client";

const required = createRequire(import.meta.url)("floodgate-client");
const client = new FloodgateClient("{CLOSED_TARGET}", {{ timeoutMs: 200 }});
const decision = await client.shouldRateLimit("probe", [{{ user_id: "alice" }}]);
client.close();
console.log(JSON.stringify({{
  sameClient: required.FloodgateClient === FloodgateClient,
  sameError: required.FloodgateError === FloodgateError,
  degraded: decision.degraded,
}}));
"""


def test_the_npm_tarball_installs_and_works_through_require_and_import(
    npm_tarball: NpmTarball, tmp_path: Path
) -> None:
    (tmp_path / "package.json").write_text(json.dumps({"name": "probe", "private": True}))
    # The package asks for Node 22 or newer; on an older local Node, npm only warns.
    install = ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"]
    run([*install, "--engine-strict=false", npm_tarball.path], tmp_path)
    (tmp_path / "probe.mjs").write_text(INSTALLED_NPM_PROBE)
    output = run(["node", "probe.mjs"], tmp_path)
    assert json.loads(output) == {"sameClient": True, "sameError": True, "degraded": True}
    required = run(
        ["node", "-e", "console.log(Object.keys(require('floodgate-client')))"], tmp_path
    )
    assert "FloodgateClient" in required
