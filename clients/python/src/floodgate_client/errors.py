"""The one exception the client raises for floodgate's answers."""

from __future__ import annotations

import grpc


class FloodgateError(Exception):
    """floodgate refused the request itself, or the client is set up wrong.

    Raised for every status but UNAVAILABLE and DEADLINE_EXCEEDED (which the failure mode
    decides): a bad request (INVALID_ARGUMENT), a server that is not a rate-limit service
    (UNIMPLEMENTED), refused credentials, a server bug. These would repeat on every attempt,
    and failing open on them would hide them. ``details`` is the server's own message.
    """

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"floodgate answered {code.name}: {details}")
        self.code = code
        self.details = details
