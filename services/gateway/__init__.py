"""The Switchyard gateway: KServe v2 REST + gRPC in front of an embedded or Triton backend."""

from services.gateway.app import create_app
from services.gateway.backends.base import Backend
from services.gateway.backends.embedded import EmbeddedBackend
from services.gateway.dataplane import DataPlane
from services.gateway.errors import GatewayError
from services.gateway.metrics import GatewayMetrics
from services.gateway.settings import Settings

__all__ = [
    "Backend",
    "DataPlane",
    "EmbeddedBackend",
    "GatewayError",
    "GatewayMetrics",
    "Settings",
    "create_app",
]
