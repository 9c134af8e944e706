"""The ASGI middleware, driven through httpx's ASGI transport against a real floodgate."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from support import DOMAIN, AsyncCountingInterceptor, Floodgate

from floodgate_client import AsyncClient, RateLimitMiddleware
from floodgate_client.middleware import DescriptorsFor, Message, Receive, Scope, Send


async def hello(scope: Scope, receive: Receive, send: Send) -> None:
    """The wrapped application: 200, one header of its own, a short body."""
    await send({"type": "http.response.start", "status": 200, "headers": [(b"x-app", b"yes")]})
    await send({"type": "http.response.body", "body": b"hello"})


def per_user(scope: Scope) -> list[dict[str, str]] | None:
    """Limits requests by their x-user-id header; requests without one are not limited."""
    user = dict(scope["headers"]).get(b"x-user-id")
    return [{"user_id": user.decode()}] if user else None


async def per_user_async(scope: Scope) -> list[dict[str, str]] | None:
    """per_user, as an async function."""
    return per_user(scope)


def get_all(
    client: AsyncClient, users: list[str | None], descriptors: DescriptorsFor = per_user
) -> list[httpx.Response]:
    """Sends one GET per user (as x-user-id; None sends none) through the middleware."""
    app = RateLimitMiddleware(hello, client=client, domain=DOMAIN, descriptors=descriptors)

    async def main() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with client, httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            headers = [{"x-user-id": user} if user else {} for user in users]
            return [await http.get("/", headers=h) for h in headers]

    return asyncio.run(main())


def test_allowed_request_reaches_the_app_and_gets_floodgates_headers(
    floodgate: Floodgate, unique: str
) -> None:
    (response,) = get_all(AsyncClient(floodgate.grpc_target, timeout=5.0), [unique])

    assert response.status_code == 200 and response.text == "hello"
    assert response.headers["x-app"] == "yes"
    assert response.headers["ratelimit-policy"] == '"per_user";q=3;w=60'
    assert response.headers["ratelimit"].startswith('"per_user";r=2;t=')


def test_request_over_the_limit_gets_429_with_headers_and_retry_after(
    floodgate: Floodgate, unique: str
) -> None:
    responses = get_all(AsyncClient(floodgate.grpc_target, timeout=5.0), [unique] * 4)

    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    rejected = responses[3]
    assert rejected.text == "Too Many Requests\n"
    assert "x-app" not in rejected.headers
    assert rejected.headers["ratelimit"].startswith('"per_user";r=0;t=')
    assert 0 < int(rejected.headers["retry-after"]) <= 60


def test_descriptors_may_come_from_an_async_function(floodgate: Floodgate, unique: str) -> None:
    client = AsyncClient(floodgate.grpc_target, timeout=5.0)

    responses = get_all(client, [unique] * 4, descriptors=per_user_async)

    assert [r.status_code for r in responses] == [200, 200, 200, 429]


def test_429_has_a_retry_after_even_when_floodgate_sends_no_headers(
    own_floodgate: Floodgate, unique: str
) -> None:
    client = AsyncClient(own_floodgate.grpc_target, timeout=5.0)

    responses = get_all(client, [unique] * 4)

    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    assert "ratelimit" not in responses[0].headers
    assert 0 < int(responses[3].headers["retry-after"]) <= 60


def test_request_without_descriptors_is_not_checked(own_floodgate: Floodgate) -> None:
    own_floodgate.stop()
    attempts = AsyncCountingInterceptor()
    client = AsyncClient(own_floodgate.grpc_target, failure_mode="closed", interceptors=[attempts])

    (response,) = get_all(client, [None])

    assert response.status_code == 200
    assert attempts.sent_at == []


def test_fail_closed_middleware_rejects_when_floodgate_is_down(
    own_floodgate: Floodgate, unique: str
) -> None:
    own_floodgate.stop()
    client = AsyncClient(own_floodgate.grpc_target, timeout=5.0, failure_mode="closed")

    (response,) = get_all(client, [unique])

    assert response.status_code == 429
    assert "retry-after" not in response.headers


def test_lifespan_and_websocket_scopes_pass_through_unchecked(own_floodgate: Floodgate) -> None:
    own_floodgate.stop()
    attempts = AsyncCountingInterceptor()
    client = AsyncClient(own_floodgate.grpc_target, failure_mode="closed", interceptors=[attempts])
    seen: list[str] = []

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    middleware = RateLimitMiddleware(
        app, client=client, domain=DOMAIN, descriptors=lambda scope: [{"user_id": "anyone"}]
    )

    async def main() -> None:
        async def nothing() -> Message:
            return {}

        async def drop(message: Message) -> None:
            return None

        for kind in ("lifespan", "websocket"):
            await middleware({"type": kind, "headers": []}, nothing, drop)

    asyncio.run(main())

    assert seen == ["lifespan", "websocket"]
    assert attempts.sent_at == []
