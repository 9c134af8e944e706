"""The one exception the client raises for floodgate's answers."""

from __future__ import annotations

import grpc


class FloodgateError(Exception):
    """floodgate refused the request itself, or the client is set up wrong.

    Raised for errors that would repeat on every attempt (a bad request, a server that is
    not floodgate, missing credentials) instead of applying the failure mode: failing open
    on a bug would hide it. ``details`` is the server's own message.
    """

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"floodgate answered {code.name}: {details}")
        self.code = code
        self.details = details
