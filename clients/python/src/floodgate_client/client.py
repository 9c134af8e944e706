"""The blocking client."""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import TracebackType

import grpc

from ._proto.envoy.service.ratelimit.v3 import rls_pb2_grpc
from ._channel import channel_options
from ._wire import Descriptor, build_request, decision_from_response
from .decision import Decision
from .policy import Backoff, CallPolicy, FailureMode, remaining


class Client:
    """Asks floodgate whether requests are within their limits, over one gRPC channel.

    ``target`` is floodgate's gRPC address (``host:port``, or ``unix:/path`` for its Unix
    socket, whose calls get the authority ``localhost`` unless ``options`` set
    ``grpc.default_authority``). ``timeout`` is one deadline over the whole call: every
    attempt and every wait between attempts fits in it, each attempt getting what is left.
    An UNAVAILABLE that floodgate marks as counting nothing
    (``floodgate-counted: none``) is sent again, up to ``max_attempts`` in all, after a
    ``backoff`` wait; an unmarked one may already have been counted, so it is sent again
    only with ``retry_possibly_counted=True`` (then by gRPC's own retry policy). When no
    attempt answers, ``failure_mode`` decides: ``"open"`` allows, ``"closed"`` rejects;
    either way the decision is marked ``degraded``.

    ``credentials`` opens a TLS channel; ``interceptors`` wrap every attempt the client
    makes itself (under ``retry_possibly_counted`` gRPC's attempts happen inside one);
    ``options`` are gRPC channel arguments. The client is thread-safe; close it (or use it
    as a context manager) to release the channel.
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
        interceptors: Sequence[grpc.UnaryUnaryClientInterceptor] = (),
        options: Sequence[tuple[str, object]] = (),
    ) -> None:
        self._policy = CallPolicy(
            timeout, failure_mode, max_attempts, backoff, retry_possibly_counted
        )
        options = channel_options(target, [*self._policy.channel_options(), *options])
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
        with its message, e.g. for an empty domain) or answers any status other than
        UNAVAILABLE and DEADLINE_EXCEEDED (which the failure mode decides), and
        TypeError/ValueError for arguments that cannot be sent.
        """
        request = build_request(domain, descriptors, hits)
        deadline = self._policy.deadline()
        attempt = 1
        while True:
            try:
                response = self._stub.ShouldRateLimit(request, timeout=remaining(deadline))
            except grpc.RpcError as error:
                delay = self._policy.next_delay(error, attempt, deadline)
                if delay is None:
                    return self._policy.give_up(error)
                time.sleep(delay)
                attempt += 1
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
