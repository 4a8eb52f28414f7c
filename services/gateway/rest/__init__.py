"""KServe v2 REST front end."""

from services.gateway.rest.app import add_routes
from services.gateway.rest.endpoints import Endpoints

__all__ = ["Endpoints", "add_routes"]
