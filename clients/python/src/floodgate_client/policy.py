"""What the client does when a call fails: retry, fall back on the failure mode, or raise.

Shared by the sync and the asyncio client, which differ only in how they wait.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Literal

import grpc

from .decision import Decision
from .errors import FloodgateError

FailureMode = Literal["open", "closed"]

log = logging.getLogger("floodgate_client")

# Errors that would come back on every attempt: the request or the setup is wrong. Failing
# open on them would hide a bug, so they raise. Every other error means floodgate could not
# decide, which is what the failure mode is for.
_RAISED = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
    }
)


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter between attempts.

    Before retry ``n`` (0 for the first) the client waits a random time between half and
    all of ``min(maximum, initial * multiplier ** n)``: never zero, so retries really back
    off, and spread out, so clients that lost floodgate together do not return in step.
    """

    initial: float = 0.005
    multiplier: float = 2.0
    maximum: float = 0.1

    def __post_init__(self) -> None:
        if self.initial <= 0 or self.maximum < self.initial or self.multiplier < 1:
            raise ValueError("backoff needs 0 < initial <= maximum and multiplier >= 1")

    def ceiling(self, retry: int) -> float:
        """The longest wait before retry ``retry``."""
        return min(self.maximum, self.initial * self.multiplier**retry)

    def delay(self, retry: int, rng: random.Random | None = None) -> float:
        """A jittered wait before retry ``retry``, in ``[ceiling / 2, ceiling]``."""
        ceiling = self.ceiling(retry)
        return (rng or random).uniform(ceiling / 2, ceiling)


@dataclass(frozen=True)
class CallPolicy:
    """A client's options for one call: deadline, retries and the failure mode."""

    timeout: float
    failure_mode: FailureMode
    retries: int
    backoff: Backoff
    rng: random.Random = field(default_factory=random.Random, compare=False)

    def __post_init__(self) -> None:
        if self.timeout <= 0:
            raise ValueError(f"timeout must be positive seconds, got {self.timeout!r}")
        if self.failure_mode not in ("open", "closed"):
            raise ValueError(f"failure_mode must be 'open' or 'closed', got {self.failure_mode!r}")
        if self.retries < 0:
            raise ValueError(f"retries must be 0 or more, got {self.retries!r}")

    def retry_delay(self, error: grpc.RpcError, retry: int) -> float | None:
        """Seconds to wait before retry number ``retry``, or None when ``error`` is final.

        Only UNAVAILABLE is retried: the request never reached floodgate, so trying again
        cannot count it twice. A DEADLINE_EXCEEDED call may have been counted, and its
        retry would spend a second timeout of the caller's latency.
        """
        if error.code() != grpc.StatusCode.UNAVAILABLE or retry >= self.retries:
            return None
        return self.backoff.delay(retry, self.rng)

    def give_up(self, error: grpc.RpcError) -> Decision:
        """The failure mode's decision after the last attempt, or FloodgateError."""
        code, details = error.code(), error.details() or ""
        if code in _RAISED:
            raise FloodgateError(code, details)
        log.warning(
            "floodgate did not answer (%s: %s); failing %s", code.name, details, self.failure_mode
        )
        return Decision(allowed=self.failure_mode == "open", degraded=True)
