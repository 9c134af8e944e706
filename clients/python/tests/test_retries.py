"""Retries and the one deadline, for the blocking and the asyncio client, against floodgate on
a real Redis that is frozen (UNAVAILABLE that may have counted) or missing (UNAVAILABLE marked
``floodgate-counted: none``). Attempts are counted by the server's own metrics, never
inferred from elapsed time."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from support import DOMAIN, Floodgate

from floodgate_client import AsyncClient, Backoff, Client, Decision

QUICK = Backoff(initial=0.001, maximum=0.004)
#: The shortest pauses gRPC's retry policy takes (retry_possibly_counted).
QUICK_FOR_GRPC = Backoff(initial=0.002, maximum=0.008)
CLIENTS = ["sync", "async"]


def ask(kind: str, server: Floodgate, **options: Any) -> Decision:
    """One should_rate_limit call through a fresh client of ``kind``."""
    if kind == "sync":
        with Client(server.grpc_target, **options) as client:
            return client.should_rate_limit(DOMAIN, [{"user_id": "alice"}])

    async def call() -> Decision:
        async with AsyncClient(server.grpc_target, **options) as client:
            return await client.should_rate_limit(DOMAIN, [{"user_id": "alice"}])

    return asyncio.run(call())


def failed_open(decision: Decision) -> bool:
    return decision.allowed and decision.degraded


@pytest.mark.parametrize("kind", CLIENTS)
def test_an_unavailable_that_may_have_counted_is_sent_once(
    kind: str, frozen_redis: Floodgate
) -> None:
    decision = ask(kind, frozen_redis, timeout=5.0, max_attempts=4, backoff=QUICK)

    assert failed_open(decision)
    assert frozen_redis.requests_answered("UNAVAILABLE") == 1


@pytest.mark.parametrize("kind", CLIENTS)
def test_an_unavailable_that_counted_nothing_is_retried_up_to_max_attempts(
    kind: str, no_redis: Floodgate
) -> None:
    decision = ask(
        kind, no_redis, timeout=5.0, failure_mode="closed", max_attempts=4, backoff=QUICK
    )

    assert not decision.allowed and decision.degraded
    assert no_redis.requests_answered("UNAVAILABLE") == 4


def test_max_attempts_one_sends_a_marked_unavailable_once(no_redis: Floodgate) -> None:
    decision = ask("sync", no_redis, timeout=5.0, max_attempts=1)

    assert failed_open(decision)
    assert no_redis.requests_answered("UNAVAILABLE") == 1


@pytest.mark.parametrize("kind", CLIENTS)
def test_retry_possibly_counted_retries_an_unmarked_unavailable_too(
    kind: str, frozen_redis: Floodgate
) -> None:
    decision = ask(
        kind,
        frozen_redis,
        timeout=5.0,
        max_attempts=3,
        backoff=QUICK_FOR_GRPC,
        retry_possibly_counted=True,
    )

    assert failed_open(decision)
    assert frozen_redis.requests_answered("UNAVAILABLE") == 3


@pytest.mark.parametrize("kind", CLIENTS)
def test_one_deadline_covers_every_attempt_of_grpcs_retry_policy(
    kind: str, frozen_redis_until_deadline: Floodgate
) -> None:
    """floodgate waits for the frozen Redis until most of what the caller has left (80%), then
    answers UNAVAILABLE. Attempts with a timeout each would make all five; under one deadline
    each gets what the ones before it left, so about one fits: another needs a pause shorter
    than the 200 ms left, and grpcio's pauses stay within 20% of a second."""
    decision = ask(
        kind,
        frozen_redis_until_deadline,
        timeout=1.0,
        max_attempts=5,
        backoff=Backoff(initial=1.0, maximum=1.0),
        retry_possibly_counted=True,
    )

    assert failed_open(decision)
    attempts = frozen_redis_until_deadline.requests_answered("UNAVAILABLE")
    assert 1 <= attempts < 5, f"{attempts} attempts: the deadline should have ended the call"


@pytest.mark.parametrize("kind", CLIENTS)
def test_one_deadline_covers_the_clients_own_retries_of_marked_answers(
    kind: str, no_redis: Floodgate
) -> None:
    """Marked answers come at once; the waits between them (up to 10 s each) are what the
    one-second deadline must cut short. Five attempts would need four waits adding up to
    under a second (about one chance in 240,000)."""
    decision = ask(
        kind, no_redis, timeout=1.0, max_attempts=5, backoff=Backoff(initial=10.0, maximum=10.0)
    )

    assert failed_open(decision)
    attempts = no_redis.requests_answered("UNAVAILABLE")
    assert 1 <= attempts < 5, f"{attempts} attempts: a wait past the deadline should end the call"
