"""Python client for floodgate, an Envoy-compatible gRPC rate-limit service.

``Client`` (blocking) and ``AsyncClient`` (asyncio) send ``ShouldRateLimit`` and return a
``Decision``; ``RateLimitMiddleware`` applies the decisions to an ASGI application.
"""

from ._wire import Descriptor
from .aio import AsyncClient
from .client import Client
from .decision import Decision, DescriptorStatus, Limit
from .errors import FloodgateError
from .middleware import RateLimitMiddleware
from .policy import Backoff, FailureMode

__all__ = [
    "AsyncClient",
    "Backoff",
    "Client",
    "Decision",
    "Descriptor",
    "DescriptorStatus",
    "FailureMode",
    "FloodgateError",
    "Limit",
    "RateLimitMiddleware",
]
