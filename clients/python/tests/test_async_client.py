"""The asyncio client against a real floodgate: the same decisions as the blocking one."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc
import pytest
from support import DOMAIN, Floodgate

from floodgate_client import AsyncClient, Decision, FloodgateError

T = TypeVar("T")


def run_with_client(floodgate: Floodgate, body: Callable[[AsyncClient], Awaitable[T]]) -> T:
    """Runs ``body`` in a fresh event loop with a client made inside that loop."""

    async def main() -> T:
        async with AsyncClient(floodgate.grpc_target, timeout=5.0) as client:
            return await body(client)

    return asyncio.run(main())


def test_async_requests_are_allowed_up_to_the_limit_then_rejected(
    floodgate: Floodgate, unique: str
) -> None:
    async def four_requests(client: AsyncClient) -> list[Decision]:
        return [await client.should_rate_limit(DOMAIN, [{"user_id": unique}]) for _ in range(4)]

    decisions = run_with_client(floodgate, four_requests)

    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert [d.statuses[0].remaining for d in decisions] == [2, 1, 0, 0]


def test_async_concurrent_requests_count_against_one_limit(
    floodgate: Floodgate, unique: str
) -> None:
    async def ten_at_once(client: AsyncClient) -> list[Decision]:
        calls = [client.should_rate_limit(DOMAIN, [{"upload": unique}]) for _ in range(10)]
        return list(await asyncio.gather(*calls))

    first_ten = run_with_client(floodgate, ten_at_once)
    next_ten = run_with_client(floodgate, ten_at_once)

    assert sum(d.allowed for d in first_ten) == 10
    assert sum(d.allowed for d in next_ten) == 0


def test_async_request_floodgate_refuses_raises_its_message(floodgate: Floodgate) -> None:
    async def empty_domain(client: AsyncClient) -> Decision:
        return await client.should_rate_limit("", [{"user_id": "alice"}])

    with pytest.raises(FloodgateError) as raised:
        run_with_client(floodgate, empty_domain)

    assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "domain must not be empty" in raised.value.details


def test_async_client_can_be_made_before_any_event_loop_runs(
    floodgate: Floodgate, unique: str
) -> None:
    client = AsyncClient(floodgate.grpc_target, timeout=5.0)

    async def ask() -> Decision:
        async with client:
            return await client.should_rate_limit(DOMAIN, [{"user_id": unique}], hits=2)

    decision = asyncio.run(ask())

    assert decision.allowed and decision.statuses[0].remaining == 1
