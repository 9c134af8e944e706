"""Fixtures: a real floodgate server (on memory, or on a real Redis that is frozen or
missing), a client for it, fresh descriptor values."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from support import DOMAIN, Floodgate, Redis, free_port, start_floodgate, start_redis

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


# floodgate's breaker opens when Redis stays silent for a window; the retry tests keep it
# shut, so that every answer comes from a call to Redis.
BREAKER_SHUT = {"FLOODGATE_REDIS_BREAKER_WINDOW_MS": "600000"}


@pytest.fixture
def redis() -> Iterator[Redis]:
    server = start_redis()
    yield server
    server.stop()


def frozen_redis_floodgate(redis: Redis, command_timeout_ms: int) -> Floodgate:
    """floodgate on ``redis``, which answers once and then freezes: floodgate then answers
    UNAVAILABLE without ``floodgate-counted: none``, since its script may have run. It waits
    ``command_timeout_ms`` for Redis, or less when the caller's deadline comes first."""
    settings = {"FLOODGATE_REDIS_COMMAND_TIMEOUT_MS": str(command_timeout_ms), **BREAKER_SHUT}
    server = start_floodgate("--backend", "redis", "--redis-url", redis.url, settings=settings)
    with Client(server.grpc_target, timeout=5.0) as warm:
        assert not warm.should_rate_limit(DOMAIN, [{"user_id": "warm"}]).degraded
    redis.freeze()
    return server


@pytest.fixture
def frozen_redis(redis: Redis) -> Iterator[Floodgate]:
    """floodgate on a frozen Redis, giving up on it after 200 ms."""
    server = frozen_redis_floodgate(redis, command_timeout_ms=200)
    yield server
    server.stop()


@pytest.fixture
def frozen_redis_until_deadline(redis: Redis) -> Iterator[Floodgate]:
    """floodgate on a frozen Redis, waiting for it as long as each caller's deadline allows."""
    server = frozen_redis_floodgate(redis, command_timeout_ms=60_000)
    yield server
    server.stop()


@pytest.fixture
def no_redis() -> Iterator[Floodgate]:
    """floodgate pointed at a port where no Redis listens: it answers UNAVAILABLE with
    ``floodgate-counted: none``, since it could not send anything."""
    url = f"redis://127.0.0.1:{free_port()}"
    server = start_floodgate("--backend", "redis", "--redis-url", url, settings=BREAKER_SHUT)
    yield server
    server.stop()
