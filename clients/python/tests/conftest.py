"""Fixtures: a real floodgate server, a client for it, fresh descriptor values."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from support import Floodgate, start_floodgate

from floodgate_client import Client


@pytest.fixture(scope="session")
def floodgate() -> Iterator[Floodgate]:
    """One server for the tests that only need it up, with IETF rate-limit headers."""
    server = start_floodgate("--response-headers", "ietf")
    yield server
    server.stop()


@pytest.fixture
def own_floodgate() -> Iterator[Floodgate]:
    """A server of the test's own, without rate-limit headers, which the test may stop."""
    server = start_floodgate()
    yield server
    server.stop()


@pytest.fixture
def client(floodgate: Floodgate) -> Iterator[Client]:
    """A client with a generous timeout: a busy test machine must not fail these tests."""
    with Client(floodgate.grpc_target, timeout=5.0) as client:
        yield client


@pytest.fixture
def unique() -> str:
    """A fresh descriptor value, so no two tests share a counter on the shared server."""
    return uuid.uuid4().hex
