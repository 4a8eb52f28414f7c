"""The gateway's core: readiness, metadata and inference over a ``Backend``, shared by REST and gRPC (``plane.py``),
and its streamed requests (``decoupled.py``, mixed into ``DataPlane``).

It knows nothing of HTTP or gRPC; front ends translate to and from its types and ``GatewayError``s. Every request is
routed (``Router``) and holds a lease on its version (``Leases``) until its answer is ready.
"""

from services.gateway.dataplane.plane import SERVER_NAME, SERVER_VERSION, DataPlane

__all__ = ["SERVER_NAME", "SERVER_VERSION", "DataPlane"]
