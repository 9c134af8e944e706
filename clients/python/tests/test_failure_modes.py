"""What the clients decide when floodgate itself cannot answer (stopped, frozen, lost mid-call)
and which answers raise instead. The retries floodgate's own answers call for are in
test_retries.py."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import grpc
import pytest
from support import DOMAIN, AsyncCountingInterceptor, CountingInterceptor, Floodgate

from floodgate_client import AsyncClient, Backoff, Client, Decision, FloodgateError

QUICK = Backoff(initial=0.001, maximum=0.004)


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


def test_a_connection_that_cannot_be_opened_is_decided_at_once(own_floodgate: Floodgate) -> None:
    """grpcio fails the call without saying whether anything was sent, and a retry within
    the deadline would meet the same channel in its reconnect backoff: no retry."""
    own_floodgate.stop()
    attempts = CountingInterceptor()

    with Client(
        own_floodgate.grpc_target, timeout=5.0, backoff=QUICK, interceptors=[attempts]
    ) as client:
        decision = client.should_rate_limit(DOMAIN, [{"user_id": "refused"}])

    assert decision.allowed and decision.degraded
    assert len(attempts.sent_at) == 1


def test_a_passed_deadline_is_not_retried_and_the_failure_mode_decides(
    own_floodgate: Floodgate,
) -> None:
    own_floodgate.freeze()
    attempts = CountingInterceptor()

    with Client(
        own_floodgate.grpc_target,
        timeout=0.3,
        failure_mode="closed",
        max_attempts=4,
        backoff=QUICK,
        interceptors=[attempts],
    ) as client:
        decision = client.should_rate_limit(DOMAIN, [{"user_id": "frozen"}])

    assert not decision.allowed and decision.degraded
    assert len(attempts.sent_at) == 1, "no time is left for another attempt"


def call_lost_after_sending(server: Floodgate, **options: object) -> Decision:
    """Sends a call to a frozen floodgate and kills the server once the call is on its way;
    the failure mode (closed) decides."""
    attempts = CountingInterceptor()
    server.freeze()
    decided: list[Decision] = []
    with Client(
        server.grpc_target,
        timeout=5.0,
        failure_mode="closed",
        max_attempts=4,
        backoff=QUICK,
        interceptors=[attempts],
        **options,  # type: ignore[arg-type]
    ) as client:
        call = threading.Thread(
            target=lambda: decided.append(client.should_rate_limit(DOMAIN, [{"user_id": "lost"}]))
        )
        call.start()
        while not attempts.sent_at:
            time.sleep(0.005)
        # The kernel accepts for the frozen process: give the request time to be written.
        time.sleep(0.3)
        server.kill()
        call.join()
    assert len(attempts.sent_at) == 1, "the client's own loop does not send it again"
    return decided[0]


def test_a_connection_lost_after_the_request_went_out_is_not_retried(
    own_floodgate: Floodgate,
) -> None:
    decision = call_lost_after_sending(own_floodgate)

    assert not decision.allowed and decision.degraded


def test_invalid_argument_is_raised_without_retrying(floodgate: Floodgate) -> None:
    attempts = CountingInterceptor()

    client = Client(floodgate.grpc_target, timeout=5.0, interceptors=[attempts])

    with client, pytest.raises(FloodgateError) as raised:
        client.should_rate_limit(DOMAIN, [[("", "no key")]])

    assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "empty key" in raised.value.details
    assert len(attempts.sent_at) == 1
    assert floodgate.requests_answered("INVALID_ARGUMENT") >= 1


def test_an_error_outside_the_fail_open_set_is_raised_not_degraded(floodgate: Floodgate) -> None:
    # floodgate's HTTP port speaks HTTP/2 too, but serves no gRPC: a 404, UNIMPLEMENTED.
    with (
        Client(floodgate.http_target, timeout=5.0) as client,
        pytest.raises(FloodgateError) as raised,
    ):
        client.should_rate_limit(DOMAIN, [{"user_id": "misdirected"}])

    assert raised.value.code == grpc.StatusCode.UNIMPLEMENTED


def test_async_client_fails_closed_once_floodgate_is_down(own_floodgate: Floodgate) -> None:
    own_floodgate.stop()
    attempts = AsyncCountingInterceptor()

    async def ask() -> Decision:
        async with AsyncClient(
            own_floodgate.grpc_target,
            timeout=5.0,
            failure_mode="closed",
            interceptors=[attempts],
        ) as client:
            return await client.should_rate_limit(DOMAIN, [{"user_id": "async"}])

    decision = asyncio.run(ask())

    assert not decision.allowed and decision.degraded
    assert len(attempts.sent_at) == 1


def test_async_client_raises_an_error_outside_the_fail_open_set(floodgate: Floodgate) -> None:
    async def ask() -> Decision:
        async with AsyncClient(floodgate.http_target, timeout=5.0) as client:
            return await client.should_rate_limit(DOMAIN, [{"user_id": "misdirected"}])

    with pytest.raises(FloodgateError) as raised:
        asyncio.run(ask())

    assert raised.value.code == grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.parametrize("max_attempts", [0, 6, 2.5])
def test_max_attempts_outside_one_to_five_is_refused(max_attempts: object) -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        Client("127.0.0.1:1", max_attempts=max_attempts)  # type: ignore[arg-type]


def test_backoff_waits_are_drawn_below_a_ceiling_that_doubles_up_to_the_maximum() -> None:
    backoff = Backoff(initial=0.01, maximum=0.05)
    rng = random.Random(7)

    waits = [[backoff.delay(retry, rng) for _ in range(200)] for retry in range(1, 5)]

    for retry, samples in enumerate(waits, start=1):
        ceiling = min(0.05, 0.01 * 2 ** (retry - 1))
        assert all(0 <= wait <= ceiling for wait in samples)
        assert min(samples) < ceiling / 4, "full jitter: a wait can be far below its ceiling"
        assert len(set(samples)) > 100, "waits are jittered, not fixed"
