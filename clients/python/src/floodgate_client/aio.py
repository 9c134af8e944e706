"""The asyncio client, on ``grpc.aio``."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import TracebackType

import grpc
import grpc.aio

from ._proto.envoy.service.ratelimit.v3 import rls_pb2_grpc
from ._channel import channel_options
from ._wire import Descriptor, build_request, decision_from_response
from .decision import Decision
from .policy import Backoff, CallPolicy, FailureMode, remaining


class AsyncClient:
    """The asyncio twin of ``Client``: same options, same decisions, awaited.

    The channel opens on the first call, inside the running event loop: a ``grpc.aio``
    channel belongs to the loop it was made in, and this lets an application build the
    client at import time (e.g. for the ASGI middleware) before its server starts a loop.
    Use the client from one event loop.
    """

    def __init__(
        self,
        target: str,
        *,
        timeout: float = 0.02,
        failure_mode: FailureMode = "open",
        max_attempts: int = 3,
        backoff: Backoff = Backoff(),
        retry_possibly_counted: bool = False,
        credentials: grpc.ChannelCredentials | None = None,
        interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
        options: Sequence[tuple[str, object]] = (),
    ) -> None:
        self._policy = CallPolicy(
            timeout, failure_mode, max_attempts, backoff, retry_possibly_counted
        )
        self._target = target
        self._credentials = credentials
        self._interceptors = list(interceptors)
        self._options = channel_options(target, [*self._policy.channel_options(), *options])
        self._channel: grpc.aio.Channel | None = None
        self._stub: rls_pb2_grpc.RateLimitServiceStub | None = None

    async def should_rate_limit(
        self, domain: str, descriptors: Sequence[Descriptor], hits: int = 1
    ) -> Decision:
        """Counts ``hits`` against every descriptor of ``domain``; see ``Client``."""
        request = build_request(domain, descriptors, hits)
        stub = self._connected_stub()
        deadline = self._policy.deadline()
        attempt = 1
        while True:
            try:
                response = await stub.ShouldRateLimit(request, timeout=remaining(deadline))
            except grpc.RpcError as error:
                delay = self._policy.next_delay(error, attempt, deadline)
                if delay is None:
                    return self._policy.give_up(error)
                await asyncio.sleep(delay)
                attempt += 1
            else:
                return decision_from_response(response)

    def _connected_stub(self) -> rls_pb2_grpc.RateLimitServiceStub:
        """The stub, opening the channel in the running loop on first use."""
        if self._stub is None:
            self._channel = self._open_channel()
            self._stub = rls_pb2_grpc.RateLimitServiceStub(self._channel)
        return self._stub

    def _open_channel(self) -> grpc.aio.Channel:
        if self._credentials is None:
            return grpc.aio.insecure_channel(
                self._target, options=self._options, interceptors=self._interceptors
            )
        return grpc.aio.secure_channel(
            self._target, self._credentials, options=self._options, interceptors=self._interceptors
        )

    async def close(self) -> None:
        """Closes the channel, if one was opened; a later call opens a new one."""
        if self._channel is not None:
            channel, self._channel, self._stub = self._channel, None, None
            await channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()
