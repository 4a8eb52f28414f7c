"""Backends that run model versions behind the dataplane."""

from services.gateway.backends.base import Backend

__all__ = ["Backend"]
