"""floodgate on a Unix socket, asked by grpcio: gRPC's C core sends the socket's path,
percent-encoded, as every call's ``:authority``, which the server mends for its HTTP/2
stack; floodgate's client sends ``localhost`` anyway (as grpc-go does)."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from support import DOMAIN, Floodgate, start_floodgate

from floodgate_client import AsyncClient, Client
from floodgate_client._channel import channel_options
from floodgate_client._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from floodgate_client._wire import build_request


@pytest.fixture
def on_socket() -> Iterator[Floodgate]:
    """A server of the test's own whose gRPC port is a Unix socket in a fresh directory."""
    with tempfile.TemporaryDirectory() as directory:
        socket = Path(directory) / "grpc.sock"
        server = start_floodgate(settings={"FLOODGATE_GRPC_UNIX_SOCKET": str(socket)})
        assert server.grpc_target == f"unix:{socket}"
        yield server
        server.stop()


def ask(channel: grpc.Channel) -> rls_pb2.RateLimitResponse:
    """One ShouldRateLimit call straight through grpcio's stub, no floodgate client."""
    request = build_request(DOMAIN, [{"user_id": "unix-plain"}], 1)
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)
    response: rls_pb2.RateLimitResponse = stub.ShouldRateLimit(request, timeout=5.0)
    return response


def test_a_plain_grpcio_channel_is_served(on_socket: Floodgate) -> None:
    # gRPC's C core sends the socket's path, percent-encoded, as the call's authority; the
    # server mends it on the way to its HTTP/2 stack (src/unix_authority.rs). Several calls
    # on one channel: HPACK carries the authority of the later ones by reference.
    with grpc.insecure_channel(on_socket.grpc_target) as channel:
        for _ in range(3):
            assert ask(channel).overall_code == rls_pb2.RateLimitResponse.OK
        assert ask(channel).overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT


def test_a_plain_grpcio_aio_channel_is_served(on_socket: Floodgate) -> None:
    async def main() -> None:
        async with grpc.aio.insecure_channel(on_socket.grpc_target) as channel:
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)
            request = build_request(DOMAIN, [{"user_id": "unix-aio-plain"}], 1)
            response = await stub.ShouldRateLimit(request, timeout=5.0)
            assert response.overall_code == rls_pb2.RateLimitResponse.OK

    asyncio.run(main())


def test_a_grpcio_channel_with_a_default_authority_is_served(on_socket: Floodgate) -> None:
    options = [("grpc.default_authority", "localhost")]
    with grpc.insecure_channel(on_socket.grpc_target, options=options) as channel:
        response = ask(channel)
    assert response.overall_code == rls_pb2.RateLimitResponse.OK


def test_the_client_on_a_unix_socket_decides(on_socket: Floodgate) -> None:
    with Client(on_socket.grpc_target, timeout=5.0) as client:
        decision = client.should_rate_limit(DOMAIN, [{"user_id": "unix-sync"}])
    assert decision.allowed and not decision.degraded
    assert decision.statuses[0].remaining == 2


def test_the_async_client_on_a_unix_socket_decides(on_socket: Floodgate) -> None:
    async def main() -> None:
        async with AsyncClient(on_socket.grpc_target, timeout=5.0) as client:
            decision = await client.should_rate_limit(DOMAIN, [{"user_id": "unix-async"}])
        assert decision.allowed and not decision.degraded
        assert decision.statuses[0].remaining == 2

    asyncio.run(main())


def test_an_authority_the_caller_names_is_kept_and_other_targets_get_none() -> None:
    named = [("grpc.default_authority", "floodgate.local")]
    assert channel_options("unix:/run/floodgate/grpc.sock", named) == named
    assert channel_options("127.0.0.1:8081", []) == []
    assert channel_options("dns:///floodgate:8081", []) == []
