"""ASGI middleware: one floodgate decision per HTTP request."""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import Any

from ._wire import Descriptor
from .aio import AsyncClient
from .decision import Decision

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

Descriptors = Sequence[Descriptor] | None
#: Picks a request's descriptors from its scope; None (or no descriptors) skips the check.
DescriptorsFor = Callable[[Scope], Descriptors | Awaitable[Descriptors]]

_REJECTED_BODY = b"Too Many Requests\n"


class RateLimitMiddleware:
    """Asks floodgate about every HTTP request before the wrapped app sees it.

    Over the limit, the request gets a 429 with floodgate's headers (``RateLimit*`` and
    ``Retry-After``) and a short text body, and never reaches the app. Allowed, it goes on
    to the app and floodgate's headers are added to the app's response. ``descriptors``
    (plain or async) builds the descriptors from the ASGI scope; returning None lets the
    request through unchecked. Lifespan and websocket scopes pass through untouched.

    A degraded decision follows the client's failure mode: fail-open passes, fail-closed
    answers 429 (without headers: floodgate gave none). A FloodgateError (a request
    floodgate refuses, such as an empty descriptor entry) propagates to the server.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        client: AsyncClient,
        domain: str,
        descriptors: DescriptorsFor,
    ) -> None:
        self.app = app
        self._client = client
        self._domain = domain
        self._descriptors = descriptors

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        descriptors = self._descriptors(scope)
        if inspect.isawaitable(descriptors):
            descriptors = await descriptors
        if not descriptors:
            await self.app(scope, receive, send)
            return
        decision = await self._client.should_rate_limit(self._domain, descriptors)
        if decision.allowed:
            await self.app(scope, receive, _adding_headers(send, _encode(decision.headers)))
        else:
            await _reject(send, decision)


def _adding_headers(send: Send, headers: list[tuple[bytes, bytes]]) -> Send:
    """``send``, adding ``headers`` to the response's start message."""
    if not headers:
        return send

    async def send_with_headers(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *headers]}
        await send(message)

    return send_with_headers


async def _reject(send: Send, decision: Decision) -> None:
    """Answers 429 with floodgate's headers, adding Retry-After if floodgate gave none."""
    headers = dict(decision.headers)
    retry_after = _retry_after(decision)
    if retry_after is not None and "retry-after" not in {name.lower() for name in headers}:
        headers["retry-after"] = retry_after
    headers["content-type"] = "text/plain; charset=utf-8"
    headers["content-length"] = str(len(_REJECTED_BODY))
    await send({"type": "http.response.start", "status": 429, "headers": _encode(headers)})
    await send({"type": "http.response.body", "body": _REJECTED_BODY})


def _retry_after(decision: Decision) -> str | None:
    """Whole seconds until every descriptor over its limit has quota again, if known."""
    waits = [status.reset.total_seconds() for status in decision.statuses if not status.allowed]
    if not waits:
        return None
    return str(max(1, math.ceil(max(waits))))


def _encode(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    """ASGI header pairs: lower-case latin-1 names and values."""
    return [
        (name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()
    ]
