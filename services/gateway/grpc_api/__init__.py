"""KServe v2 gRPC front end."""

from services.gateway.grpc_api.server import start_server
from services.gateway.grpc_api.servicer import InferenceServicer, status_code

__all__ = ["InferenceServicer", "start_server", "status_code"]
