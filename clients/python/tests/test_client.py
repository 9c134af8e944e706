"""The blocking client against a real floodgate: decisions, statuses, hits, errors."""

from __future__ import annotations

import math
from datetime import timedelta

import grpc
import pytest
from support import DOMAIN

from floodgate_client import Client, Decision, FloodgateError, Limit

# The per-user rule in tests/rules: 3 requests in any minute.
USER_LIMIT = Limit(requests_per_unit=3, unit="minute", name="per_user")


def test_requests_are_allowed_up_to_the_limit_then_rejected(client: Client, unique: str) -> None:
    decisions = [client.should_rate_limit(DOMAIN, [{"user_id": unique}]) for _ in range(4)]

    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert not any(d.degraded for d in decisions)


def test_status_reports_the_limit_the_quota_left_and_the_time_to_reset(
    client: Client, unique: str
) -> None:
    first = client.should_rate_limit(DOMAIN, [{"user_id": unique}]).statuses[0]
    second = client.should_rate_limit(DOMAIN, [{"user_id": unique}]).statuses[0]

    assert first.allowed and first.limit == USER_LIMIT
    assert (first.remaining, second.remaining) == (2, 1)
    assert timedelta(seconds=50) < first.reset <= timedelta(minutes=1)


def test_one_descriptor_over_its_limit_rejects_the_request_and_only_its_status(
    client: Client, unique: str
) -> None:
    for _ in range(3):
        client.should_rate_limit(DOMAIN, [{"user_id": unique}])

    decision = client.should_rate_limit(
        DOMAIN, [{"path": f"/{unique}"}, {"user_id": unique}, {"unknown_key": "x"}]
    )

    assert not decision.allowed
    path, user, unknown = decision.statuses
    assert path.allowed and path.remaining == 99 and path.limit is not None
    assert not user.allowed and user.remaining == 0 and user.limit == USER_LIMIT
    assert unknown.allowed and unknown.limit is None


def test_ordered_entries_select_the_nested_rule(client: Client, unique: str) -> None:
    descriptor = [("path", f"/{unique}"), ("method", "GET")]

    decisions = [client.should_rate_limit(DOMAIN, [descriptor]) for _ in range(3)]

    assert [d.allowed for d in decisions] == [True, True, False]
    assert decisions[0].statuses[0].limit == Limit(requests_per_unit=2, unit="hour")


def test_hits_cost_several_units_of_quota(client: Client, unique: str) -> None:
    descriptors = [{"upload": unique}]

    first = client.should_rate_limit(DOMAIN, descriptors, hits=4)
    second = client.should_rate_limit(DOMAIN, descriptors, hits=4)
    too_many = client.should_rate_limit(DOMAIN, descriptors, hits=4)

    assert first.statuses[0].limit == Limit(requests_per_unit=10, unit="minute", unit_multiplier=10)
    assert (first.statuses[0].remaining, second.statuses[0].remaining) == (6, 2)
    assert not too_many.allowed
    # A rejected request is not counted: the 2 left can still be spent.
    assert client.should_rate_limit(DOMAIN, descriptors, hits=2).allowed


def test_decision_carries_the_headers_floodgate_asks_to_add(client: Client, unique: str) -> None:
    for _ in range(3):
        allowed = client.should_rate_limit(DOMAIN, [{"user_id": unique}])
    rejected = client.should_rate_limit(DOMAIN, [{"user_id": unique}])

    assert allowed.headers["ratelimit"] == f'"per_user";r=0;t={_ceil_seconds(allowed)}'
    assert allowed.headers["ratelimit-policy"] == '"per_user";q=3;w=60'
    assert "retry-after" not in allowed.headers
    assert int(rejected.headers["retry-after"]) == _ceil_seconds(rejected)


def test_a_request_floodgate_refuses_raises_its_message(client: Client, unique: str) -> None:
    with pytest.raises(FloodgateError) as raised:
        client.should_rate_limit("", [{"user_id": unique}])

    assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "domain must not be empty" in str(raised.value)


def test_a_single_descriptor_not_wrapped_in_a_list_is_a_type_error(client: Client) -> None:
    with pytest.raises(TypeError, match="list of descriptors"):
        client.should_rate_limit(DOMAIN, {"user_id": "alice"})  # type: ignore[arg-type]


def _ceil_seconds(decision: Decision) -> int:
    """The reset floodgate's headers announce: whole seconds, rounded up."""
    return math.ceil(decision.statuses[0].reset.total_seconds())
