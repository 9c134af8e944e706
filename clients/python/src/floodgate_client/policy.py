"""What the client does when an attempt fails: send it again, let the failure mode decide, or
raise. The same rules as the Rust and TypeScript clients (docs/clients.md in the repository).

Shared by the sync and the asyncio client, which differ only in how they wait.
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Literal

import grpc

from .decision import Decision
from .errors import FloodgateError

FailureMode = Literal["open", "closed"]

log = logging.getLogger("floodgate_client")

#: The most attempts one call makes; gRPC's retry policy has the same limit.
MAX_ATTEMPTS = 5

#: The shortest first pause gRPC's retry policy is given: grpcio (1.85) loses a retry whose
#: timer is due within about 2 ms, and the call then waits out its deadline.
GRPC_MIN_INITIAL_BACKOFF = 0.002

#: floodgate's trailer on an UNAVAILABLE that counted nothing (the circuit breaker was open,
#: the request was shed, Redis could not be reached or ran nothing).
COUNTED_KEY = "floodgate-counted"
NOTHING_COUNTED = "none"

# The failures the failure mode decides: floodgate could not answer (down, unreachable, its
# backend down, the connection lost) or not in time. Every other status raises: it would
# repeat on every call, and failing open on it would hide the bug.
_FAIL_OPEN = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

_METHOD = {"service": "envoy.service.ratelimit.v3.RateLimitService", "method": "ShouldRateLimit"}


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff with full jitter between attempts.

    Before retry ``n`` (1 for the first) the client waits a random time between zero and
    ``min(maximum, initial * 2 ** (n - 1))`` seconds, as gRPC's own retry policy does, so
    clients that lost floodgate together do not come back in step.
    """

    initial: float = 0.002
    maximum: float = 0.01

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.maximum:
            raise ValueError("backoff needs 0 < initial <= maximum (seconds)")

    def ceiling(self, retry: int) -> float:
        """The longest wait before retry ``retry``."""
        return min(self.maximum, self.initial * 2 ** (retry - 1))

    def delay(self, retry: int, rng: random.Random | None = None) -> float:
        """A jittered wait before retry ``retry``, in ``[0, ceiling]``."""
        return (rng or random).uniform(0, self.ceiling(retry))


@dataclass(frozen=True)
class CallPolicy:
    """A client's options for one call: the deadline, retries and the failure mode."""

    timeout: float
    failure_mode: FailureMode
    max_attempts: int
    backoff: Backoff
    retry_possibly_counted: bool
    rng: random.Random = field(default_factory=random.Random, compare=False)

    def __post_init__(self) -> None:
        if self.timeout <= 0:
            raise ValueError(f"timeout must be positive seconds, got {self.timeout!r}")
        if self.failure_mode not in ("open", "closed"):
            raise ValueError(f"failure_mode must be 'open' or 'closed', got {self.failure_mode!r}")
        if not isinstance(self.max_attempts, int) or not 1 <= self.max_attempts <= MAX_ATTEMPTS:
            raise ValueError(
                f"max_attempts must be an integer from 1 to {MAX_ATTEMPTS}, "
                f"got {self.max_attempts!r}"
            )
        if self.retry_possibly_counted and self.backoff.initial < GRPC_MIN_INITIAL_BACKOFF:
            raise ValueError(
                "with retry_possibly_counted, backoff.initial must be at least "
                f"{GRPC_MIN_INITIAL_BACKOFF} s: gRPC's retry policy loses retries due sooner"
            )

    def channel_options(self) -> list[tuple[str, object]]:
        """gRPC channel arguments: the retry policy when every UNAVAILABLE may be retried.

        gRPC's own retry policy sees only status codes, not floodgate's marker, so it fits
        only ``retry_possibly_counted``; then it makes every attempt inside the one call and
        its deadline. Otherwise the client retries marked answers itself (``next_delay``).
        """
        if not self.retry_possibly_counted or self.max_attempts == 1:
            return []
        retry_policy = {
            "maxAttempts": self.max_attempts,
            "initialBackoff": _duration(self.backoff.initial),
            "maxBackoff": _duration(self.backoff.maximum),
            "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE"],
        }
        config = {"methodConfig": [{"name": [_METHOD], "retryPolicy": retry_policy}]}
        return [("grpc.service_config", json.dumps(config)), ("grpc.enable_retries", 1)]

    def deadline(self) -> float:
        """The ``time.monotonic()`` by which a call starting now must be over."""
        return time.monotonic() + self.timeout

    def next_delay(self, error: grpc.RpcError, attempt: int, deadline: float) -> float | None:
        """Seconds to wait before sending again after attempt ``attempt`` failed with
        ``error``, or None when the call ends here.

        Only an UNAVAILABLE that floodgate marked as counting nothing is sent again, up to
        ``max_attempts`` and only while the wait ends before ``deadline``. An unmarked one may
        have been counted (floodgate answers UNAVAILABLE after a Redis timeout when the
        script may have run), so it ends the call; under ``retry_possibly_counted`` gRPC's
        retry policy has already made its attempts.
        """
        if self.retry_possibly_counted or attempt >= self.max_attempts:
            return None
        if error.code() != grpc.StatusCode.UNAVAILABLE or not counted_nothing(error):
            return None
        delay = self.backoff.delay(attempt, self.rng)
        if time.monotonic() + delay >= deadline:
            return None
        return delay

    def give_up(self, error: grpc.RpcError) -> Decision:
        """The failure mode's decision after the last attempt, or FloodgateError."""
        code, details = error.code(), error.details() or ""
        if code not in _FAIL_OPEN:
            raise FloodgateError(code, details)
        log.warning(
            "floodgate did not answer (%s: %s); failing %s", code.name, details, self.failure_mode
        )
        return Decision(allowed=self.failure_mode == "open", degraded=True)


def counted_nothing(error: grpc.RpcError) -> bool:
    """Whether floodgate's trailers say that no hit of the failed call was counted."""
    trailers = error.trailing_metadata() or ()
    return any(key == COUNTED_KEY and value == NOTHING_COUNTED for key, value in trailers)


def remaining(deadline: float) -> float:
    """Seconds left until ``deadline``: what the next attempt may take."""
    return max(0.0, deadline - time.monotonic())


def _duration(seconds: float) -> str:
    """A protobuf JSON duration, as gRPC's service config wants it (at most 9 decimals)."""
    return f"{seconds:.9f}s"
