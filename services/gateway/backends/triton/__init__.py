"""The Triton backend: model versions served by a Triton server in explicit model-control mode, over gRPC."""

from services.gateway.backends.triton.backend import TritonBackend
from services.gateway.backends.triton.configs import ConfigTransform, identity

__all__ = ["ConfigTransform", "TritonBackend", "identity"]
