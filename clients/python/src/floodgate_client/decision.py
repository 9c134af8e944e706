"""What floodgate decided, as plain Python values (no protobuf types leak out)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from types import MappingProxyType


@dataclass(frozen=True)
class Limit:
    """The limit that decided a descriptor: ``requests_per_unit`` per window.

    The window is ``unit_multiplier`` × ``unit``; ``unit`` is a lower-case name:
    ``second``, ``minute``, ``hour``, ``day``, ``week``, ``month``, ``year`` (or ``unknown``).
    ``name`` is the rule's name, empty when the rule has none.
    """

    requests_per_unit: int
    unit: str
    unit_multiplier: int = 1
    name: str = ""


@dataclass(frozen=True)
class DescriptorStatus:
    """floodgate's answer for one descriptor of the request, in the request's order.

    ``limit`` is None when no rule limits the descriptor (unmatched, whitelisted or
    replaced). ``remaining`` is the quota left after this request; ``reset`` the time until
    the next unit of quota comes back.
    """

    allowed: bool
    limit: Limit | None
    remaining: int
    reset: timedelta


@dataclass(frozen=True)
class Decision:
    """The answer to one ``should_rate_limit`` call.

    ``allowed`` is False when any descriptor is over its limit. ``headers`` are the
    response headers floodgate asks the caller to add (``RateLimit*``, ``Retry-After``),
    with the names as floodgate wrote them (lower case).

    ``degraded`` is True when floodgate could not be reached and the client's failure
    mode decided instead: then ``statuses`` and ``headers`` are empty, since floodgate
    said nothing about the descriptors.
    """

    allowed: bool
    statuses: tuple[DescriptorStatus, ...] = ()
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    degraded: bool = False
