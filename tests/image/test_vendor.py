"""The image's offline build: scripts/vendor.sh copies every locked crate, and cargo resolves
the whole workspace (the server and clients/rust) from those copies alone, with no network
and an empty cargo home, through the source replacement the Dockerfile installs."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from image_dockerfile import REPO, Dockerfile


@pytest.fixture(scope="module")
def vendored() -> Iterator[Path]:
    """scripts/vendor.sh run into a temporary vendor/ (some 500 MB, removed after the module)."""
    with tempfile.TemporaryDirectory(prefix="floodgate-vendor-") as parent:
        vendor = Path(parent) / "vendor"
        result = subprocess.run(
            [str(REPO / "scripts/vendor.sh"), str(vendor)], capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, result.stderr[-4000:]
        yield vendor


def offline_metadata(vendor: Path, cargo_home: Path) -> subprocess.CompletedProcess[str]:
    """`cargo metadata` for the workspace, offline and locked, reading crates only from
    `vendor` through its cargo-config.toml, with `cargo_home` (empty: no registry cache)."""
    env = {**os.environ, "CARGO_HOME": str(cargo_home), "CARGO_NET_OFFLINE": "true"}
    return subprocess.run(
        [
            "cargo",
            "metadata",
            "--format-version",
            "1",
            "--frozen",
            "--locked",
            "--offline",
            "--config",
            str(vendor / "cargo-config.toml"),
            "--manifest-path",
            str(REPO / "Cargo.toml"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def locked_crates() -> set[tuple[str, str]]:
    """(name, version) of every crates.io package in Cargo.lock."""
    lock = tomllib.loads((REPO / "Cargo.lock").read_text())
    return {(p["name"], p["version"]) for p in lock["package"] if p.get("source", "").startswith("registry+")}


def test_the_snippet_points_cargo_at_the_vendor_directory_by_its_own_name(
    vendored: Path, dockerfile: Dockerfile
) -> None:
    config = tomllib.loads((vendored / "cargo-config.toml").read_text())
    assert config["source"]["crates-io"]["replace-with"] == "vendored-sources"
    # Relative, so the Dockerfile's /src/.cargo/config.toml finds /src/vendor.
    assert config["source"]["vendored-sources"]["directory"] == "vendor"
    copies = [i.words() for i in dockerfile.stages[0].all("COPY")]
    assert ["vendor/cargo-config.toml", ".cargo/config.toml"] in copies
    assert dockerfile.stages[0].one("WORKDIR").args == "/src" and ["vendor", "vendor"] in copies


def test_every_locked_crate_resolves_from_the_vendored_copies_offline(vendored: Path, tmp_path: Path) -> None:
    result = offline_metadata(vendored, tmp_path)
    assert result.returncode == 0, result.stderr
    metadata = json.loads(result.stdout)
    resolved = {(p["name"], p["version"]) for p in metadata["packages"] if p["source"]}
    assert resolved == locked_crates()
    members = {p["name"] for p in metadata["packages"] if p["id"] in metadata["workspace_members"]}
    assert members == {"floodgate", "floodgate-client"}
    # protoc comes from a crate, so the build needs no system protobuf compiler.
    assert any(name == "protoc-bin-vendored-linux-x86_64" for name, _ in resolved)
    assert not (tmp_path / "registry").exists(), "nothing is fetched into the cargo home"


def test_a_crate_missing_from_the_vendored_copies_fails_the_offline_resolution(vendored: Path, tmp_path: Path) -> None:
    """The resolution above read the vendored copies and nothing else."""
    crate = vendored / "tonic"
    aside = vendored.parent / "tonic.aside"
    crate.rename(aside)
    try:
        result = offline_metadata(vendored, tmp_path)
    finally:
        aside.rename(crate)
    assert result.returncode != 0
    assert "no matching package" in result.stderr and "`tonic`" in result.stderr, result.stderr
