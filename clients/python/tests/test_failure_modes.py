"""What the clients decide when floodgate is down: retries with backoff, then the failure mode."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest
from support import DOMAIN, AsyncCountingInterceptor, CountingInterceptor, Floodgate

from floodgate_client import AsyncClient, Backoff, Client, Decision, FloodgateError

BACKOFF = Backoff(initial=0.02, multiplier=2.0, maximum=0.5)


def test_fail_open_allows_a_degraded_decision_once_floodgate_is_down(
    own_floodgate: Floodgate,
) -> None:
    with Client(own_floodgate.grpc_target, timeout=5.0, failure_mode="open") as client:
        before = client.should_rate_limit(DOMAIN, [{"user_id": "open"}])
        own_floodgate.stop()
        after = client.should_rate_limit(DOMAIN, [{"user_id": "open"}])

    assert before.allowed and not before.degraded
    assert after.allowed and after.degraded
    assert after.statuses == () and dict(after.headers) == {}


def test_fail_closed_rejects_a_degraded_decision_once_floodgate_is_down(
    own_floodgate: Floodgate,
) -> None:
    with Client(own_floodgate.grpc_target, timeout=5.0, failure_mode="closed") as client:
        before = client.should_rate_limit(DOMAIN, [{"user_id": "closed"}])
        own_floodgate.stop()
        after = client.should_rate_limit(DOMAIN, [{"user_id": "closed"}])

    assert before.allowed and not before.degraded
    assert not after.allowed and after.degraded


def test_unavailable_is_retried_with_growing_backoff(own_floodgate: Floodgate) -> None:
    own_floodgate.stop()
    attempts = CountingInterceptor()
    client = Client(
        own_floodgate.grpc_target,
        timeout=5.0,
        retries=3,
        backoff=BACKOFF,
        interceptors=[attempts],
    )

    with client:
        decision = client.should_rate_limit(DOMAIN, [{"user_id": "retried"}])

    assert decision.degraded
    assert len(attempts.sent_at) == 4
    gaps = [later - earlier for earlier, later in zip(attempts.sent_at, attempts.sent_at[1:])]
    # Each wait is at least half its ceiling: 10 ms, 20 ms, 40 ms.
    assert all(gap >= BACKOFF.ceiling(retry) / 2 for retry, gap in enumerate(gaps)), gaps


def test_retries_zero_makes_a_single_attempt(own_floodgate: Floodgate) -> None:
    own_floodgate.stop()
    attempts = CountingInterceptor()

    client = Client(own_floodgate.grpc_target, timeout=5.0, retries=0, interceptors=[attempts])

    with client:
        assert client.should_rate_limit(DOMAIN, [{"user_id": "once"}]).degraded

    assert len(attempts.sent_at) == 1


def test_invalid_argument_is_raised_without_retrying(floodgate: Floodgate) -> None:
    attempts = CountingInterceptor()

    client = Client(floodgate.grpc_target, timeout=5.0, interceptors=[attempts])

    with client, pytest.raises(FloodgateError) as raised:
        client.should_rate_limit(DOMAIN, [[("", "no key")]])

    assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "empty key" in raised.value.details
    assert len(attempts.sent_at) == 1


def test_async_client_retries_then_fails_closed(own_floodgate: Floodgate) -> None:
    own_floodgate.stop()
    attempts = AsyncCountingInterceptor()

    async def ask() -> Decision:
        async with AsyncClient(
            own_floodgate.grpc_target,
            timeout=5.0,
            failure_mode="closed",
            retries=2,
            backoff=BACKOFF,
            interceptors=[attempts],
        ) as client:
            return await client.should_rate_limit(DOMAIN, [{"user_id": "async"}])

    decision = asyncio.run(ask())

    assert not decision.allowed and decision.degraded
    assert len(attempts.sent_at) == 3


def test_backoff_delays_are_jittered_within_half_to_all_of_a_growing_ceiling() -> None:
    backoff = Backoff(initial=0.01, multiplier=3.0, maximum=0.2)
    rng = random.Random(7)

    delays = [[backoff.delay(retry, rng) for _ in range(200)] for retry in range(4)]

    for retry, samples in enumerate(delays):
        ceiling = min(0.2, 0.01 * 3.0**retry)
        assert all(ceiling / 2 <= d <= ceiling for d in samples)
        assert len(set(samples)) > 100, "delays are jittered, not fixed"
