"""The gRPC channel arguments a target needs, besides the caller's.

gRPC's C core (grpcio's) sends a Unix socket's path, percent-encoded, as the ``:authority``
of every call on it: ``unix:/run/floodgate/grpc.sock`` calls ``run%2Ffloodgate%2Fgrpc.sock``.
That is no authority; floodgate mends it before its HTTP/2 server (the Rust ``h2`` crate)
sees it, but servers before that, and other servers behind the same proxy rules, reset
such calls (INTERNAL, RST_STREAM PROTOCOL_ERROR). So a Unix socket target is given the
authority ``localhost`` (gRPC's ``grpc.default_authority``, what grpc-go sends), unless the
caller names one."""

from __future__ import annotations

from collections.abc import Sequence

#: The target schemes gRPC's C core resolves to a Unix socket.
UNIX_SCHEMES = ("unix:", "unix-abstract:")

DEFAULT_AUTHORITY = "grpc.default_authority"


def channel_options(
    target: str, options: Sequence[tuple[str, object]]
) -> list[tuple[str, object]]:
    """``options``, with ``grpc.default_authority`` set to ``localhost`` for a Unix socket
    ``target`` whose options do not set it."""
    names_authority = any(name == DEFAULT_AUTHORITY for name, _ in options)
    if target.startswith(UNIX_SCHEMES) and not names_authority:
        return [(DEFAULT_AUTHORITY, "localhost"), *options]
    return list(options)
