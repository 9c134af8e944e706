"""Conversions between the client's Python values and the protobuf messages on the wire."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

from ._proto.envoy.config.core.v3 import base_pb2
from ._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from ._proto.envoy.service.ratelimit.v3 import rls_pb2
from .decision import Decision, DescriptorStatus, Limit

#: One descriptor: its entries in order, as a dict or as (key, value) pairs.
Descriptor = Mapping[str, str] | Sequence[tuple[str, str]]

_Response = rls_pb2.RateLimitResponse
_MAX_HITS = 2**32 - 1
_UNIT_NAMES = {number: name.lower() for name, number in _Response.RateLimit.Unit.items()}


def build_request(
    domain: str, descriptors: Sequence[Descriptor], hits: int
) -> rls_pb2.RateLimitRequest:
    """The ``RateLimitRequest`` for a call; rejects shapes protobuf would misread.

    The domain and the descriptors' contents are left for floodgate to judge, so its
    rules (and its messages) stay the only ones.
    """
    if isinstance(descriptors, (str, Mapping)):
        raise TypeError("descriptors must be a list of descriptors, e.g. [{'user_id': 'alice'}]")
    if not isinstance(hits, int) or not 1 <= hits <= _MAX_HITS:
        raise ValueError(f"hits must be an integer from 1 to {_MAX_HITS}, got {hits!r}")
    return rls_pb2.RateLimitRequest(
        domain=domain,
        descriptors=[_descriptor(d) for d in descriptors],
        hits_addend=hits,
    )


def _descriptor(descriptor: Descriptor) -> ratelimit_pb2.RateLimitDescriptor:
    """One descriptor's entries, keeping their order (it selects the rule)."""
    pairs = descriptor.items() if isinstance(descriptor, Mapping) else descriptor
    entries = []
    for pair in pairs:
        if not (
            isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(p, str) for p in pair)
        ):
            raise TypeError(
                f"a descriptor entry must be a (key, value) pair of strings, got {pair!r}"
            )
        key, value = pair
        entries.append(ratelimit_pb2.RateLimitDescriptor.Entry(key=key, value=value))
    return ratelimit_pb2.RateLimitDescriptor(entries=entries)


def decision_from_response(response: rls_pb2.RateLimitResponse) -> Decision:
    """The ``Decision`` a response carries; Envoy treats an UNKNOWN overall code as allowed."""
    return Decision(
        allowed=response.overall_code != _Response.OVER_LIMIT,
        statuses=tuple(_status(status) for status in response.statuses),
        headers=MappingProxyType(
            {header.key: _header_value(header) for header in response.response_headers_to_add}
        ),
    )


def _status(status: _Response.DescriptorStatus) -> DescriptorStatus:
    return DescriptorStatus(
        allowed=status.code != _Response.OVER_LIMIT,
        limit=_limit(status.current_limit) if status.HasField("current_limit") else None,
        remaining=status.limit_remaining,
        reset=status.duration_until_reset.ToTimedelta(),
    )


def _limit(limit: _Response.RateLimit) -> Limit:
    multiplier = limit.unit_multiplier.value if limit.HasField("unit_multiplier") else 1
    return Limit(
        requests_per_unit=limit.requests_per_unit,
        unit=_UNIT_NAMES.get(limit.unit, "unknown"),
        unit_multiplier=multiplier or 1,
        name=limit.name,
    )


def _header_value(header: base_pb2.HeaderValue) -> str:
    """The header's text; ``raw_value`` carries it when it is not valid UTF-8."""
    if header.value or not header.raw_value:
        return header.value
    return header.raw_value.decode("latin-1")
