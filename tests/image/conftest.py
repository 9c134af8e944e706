"""Fixtures shared by the image tests: the binary under test and the image's root built from
it once per session."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import image_rootfs
from image_dockerfile import REPO, Dockerfile, load
from image_sandbox import require_root


@pytest.fixture(scope="session")
def dockerfile() -> Dockerfile:
    return load()


@pytest.fixture(scope="session")
def floodgate_binary() -> Path:
    """The server under test: $FLOODGATE_BIN, else the workspace's debug build (the image has
    the release build of the same sources; both link the same libraries)."""
    binary = Path(os.environ.get("FLOODGATE_BIN", REPO / "target" / "debug" / "floodgate"))
    if not binary.is_file():
        pytest.fail(f"floodgate binary not found at {binary}: run `cargo build` or set FLOODGATE_BIN", pytrace=False)
    return binary.resolve()


@pytest.fixture(scope="session")
def image_root(floodgate_binary: Path, dockerfile: Dockerfile) -> Iterator[Path]:
    """The final stage's root filesystem (tests/image/image_rootfs.py), removed after the session."""
    require_root()
    parent = Path(tempfile.mkdtemp(prefix="floodgate-image-"))
    try:
        root = parent / "root"
        image_rootfs.assemble(root, floodgate_binary, dockerfile)
        yield root
    finally:
        shutil.rmtree(parent)
