"""The blocking client."""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import TracebackType

import grpc

from ._proto.envoy.service.ratelimit.v3 import rls_pb2_grpc
from ._wire import Descriptor, build_request, decision_from_response
from .decision import Decision
from .policy import Backoff, CallPolicy, FailureMode


class Client:
    """Asks floodgate whether requests are within their limits, over one gRPC channel.

    ``target`` is floodgate's gRPC address (``host:port``). Each attempt gets ``timeout``
    seconds; an UNAVAILABLE attempt is retried up to ``retries`` times with ``backoff``
    between attempts. When no attempt succeeds, ``failure_mode`` decides: ``"open"``
    allows, ``"closed"`` rejects; either way the decision is marked ``degraded``.

    ``credentials`` opens a TLS channel; ``interceptors`` wrap every attempt;
    ``options`` are gRPC channel arguments. The client is thread-safe; close it (or use it
    as a context manager) to release the channel.
    """

    def __init__(
        self,
        target: str,
        *,
        timeout: float = 0.02,
        failure_mode: FailureMode = "open",
        retries: int = 2,
        backoff: Backoff = Backoff(),
        credentials: grpc.ChannelCredentials | None = None,
        interceptors: Sequence[grpc.UnaryUnaryClientInterceptor] = (),
        options: Sequence[tuple[str, object]] = (),
    ) -> None:
        self._policy = CallPolicy(timeout, failure_mode, retries, backoff)
        if credentials is None:
            self._channel = grpc.insecure_channel(target, options=options)
        else:
            self._channel = grpc.secure_channel(target, credentials, options=options)
        channel = grpc.intercept_channel(self._channel, *interceptors)
        self._stub = rls_pb2_grpc.RateLimitServiceStub(channel)

    def should_rate_limit(
        self, domain: str, descriptors: Sequence[Descriptor], hits: int = 1
    ) -> Decision:
        """Counts ``hits`` against every descriptor of ``domain`` and returns the decision.

        Raises FloodgateError when floodgate rejects the request itself (INVALID_ARGUMENT
        with its message, e.g. for an empty domain), and TypeError/ValueError for
        arguments that cannot be sent.
        """
        request = build_request(domain, descriptors, hits)
        retry = 0
        while True:
            try:
                response = self._stub.ShouldRateLimit(request, timeout=self._policy.timeout)
            except grpc.RpcError as error:
                delay = self._policy.retry_delay(error, retry)
                if delay is None:
                    return self._policy.give_up(error)
                time.sleep(delay)
                retry += 1
            else:
                return decision_from_response(response)

    def close(self) -> None:
        """Closes the channel; calls in flight are cancelled."""
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
