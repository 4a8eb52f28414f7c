"""The gRPC listener: a ``grpc.aio`` server on the running loop, with the limits every connection gets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2_grpc
from tritonclient.grpc import service_pb2_grpc

from services.gateway.dataplane import DataPlane
from services.gateway.grpc_api.health import HealthService
from services.gateway.grpc_api.servicer import InferenceServicer
from services.gateway.grpc_api.stream import StreamService
from services.gateway.grpc_api.traced import TracedInferenceServicer
from services.gateway.grpc_api.unparsed import tolerant_handler
from services.gateway.repository_api import RepositoryApi
from services.gateway.security import ServerTls

# Streams one connection may have open at once. The gateway admits far fewer requests per model (max_concurrency
# plus max_queue, 320 by default) and refuses the rest, so a client multiplexing on one channel never waits on
# this; it only stops one connection from piling up calls (each a task and its message) without bound.
MAX_CONCURRENT_STREAMS = 1024

# Keep-alive ping policy, Triton's server defaults, so clients configured for Triton behave the same here: pings
# without calls count as strikes, more than one ping per 5 minutes without data is a strike, and two strikes end
# the connection (GOAWAY "too_many_pings"): a client cannot hold a connection open with pings alone.
PING_POLICY: list[tuple[str, int]] = [
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 300_000),
    ("grpc.http2.max_ping_strikes", 2),
]


SEND_LIMIT = 2**31 - 1
"""The largest message gRPC's int32 option allows: any answer goes out, whatever ``max_body_bytes`` says of requests."""


class GenericHandlersOnly:
    """What the generated ``add_..._to_server`` sees of the server: it hands its method table over twice, as a generic
    handler and as "registered methods"; only the generic one is kept. grpc.aio keeps a waiting task per registered
    method and, for every call it accepts, waits on all of them again (``asyncio.wait``, FIRST_COMPLETED): with the
    21 methods of the inference service that cost more CPU per ``ModelInfer`` than decoding and validating it. The
    generic handler finds a method by one dict lookup; it is kept as ``TolerantHandlers``."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers([TolerantHandlers(handler) for handler in handlers])

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        return None  # the same table the generic handler holds


class TolerantHandlers(grpc.GenericRpcHandler):
    """A service's generic handler with its methods tolerant of a message that does not parse (``unparsed.py``):
    INVALID_ARGUMENT rather than gRPC's UNKNOWN. Each method's handler is built once, on its first call; a method
    the service does not have is not remembered (a client may invent names without end)."""

    def __init__(self, inner: grpc.GenericRpcHandler) -> None:
        self._inner = inner
        self._handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        method: str = handler_call_details.method
        handler = self._handlers.get(method)
        if handler is None:
            found = self._inner.service(handler_call_details)
            if found is None:
                return None
            handler = self._handlers[method] = tolerant_handler(method, found)
        return handler


class GatewayServer:
    """The started ``grpc.aio`` server, its health service and its inference streams, stopped together: the health
    watches end first (with NOT_SERVING) and the streams stop taking requests, so that the grace period only waits
    for answers in flight."""

    def __init__(self, server: grpc.aio.Server, health: HealthService, streams: StreamService) -> None:
        self.server = server
        self.health = health
        self.streams = streams

    async def stop(self, grace_s: float | None) -> None:
        self.health.close()
        self.streams.close()  # inference streams stop reading: the grace period delivers what they have in flight
        await self.server.stop(grace_s)


class GrpcListenError(RuntimeError):
    """The gRPC listener could not bind its address; the message names the address and the settings."""


def receive_limit(max_message_bytes: int) -> int:
    """What gRPC itself accepts: twice the gateway's limit (at least 1 MiB more), within gRPC's int32 option."""
    return min(max_message_bytes + max(max_message_bytes, 1 << 20), 2**31 - 1)


async def start_server(
    dataplane: DataPlane,
    host: str,
    port: int,
    *,
    repository: RepositoryApi,
    max_message_bytes: int,
    max_metadata_bytes: int,
    connection_idle_s: float | None = None,
    handshake_timeout_s: float | None = None,
    health_interval_s: float = 0.5,
    health_max_watches: int = 100,
    stream_max_inflight: int = 64,
    stream_idle_timeout_s: float = 300.0,
    stream_max_open: int = 1024,
    reuse_port: bool = False,
    tls: ServerTls | None = None,
) -> tuple[GatewayServer, int]:
    """Start a ``grpc.aio`` server on the running loop (the same one uvicorn serves HTTP on).

    ``max_metadata_bytes``: a call whose metadata (HTTP/2 headers) exceed it is refused by gRPC itself while they
    are read (the HTTP listener's ``max_header_bytes``). ``connection_idle_s``: a connection without calls for this
    long gets GOAWAY and closes; ``handshake_timeout_s``: a connection that has not completed the HTTP/2 handshake by
    then is closed (a silent socket). None: gRPC's defaults (never, and 120 s). ``health_interval_s`` and
    ``health_max_watches``: the standard health service's watches (``grpc_api/health.py``); ``stream_max_inflight`` and
    ``stream_idle_timeout_s``: each ``ModelStreamInfer`` stream's bounds, ``stream_max_open`` the streams open at
    once (``grpc_api/stream.py``). ``reuse_port``: the
    node's workers listen on the same port (``serve --workers N``). ``tls``: serve TLS (mutual TLS with a client CA),
the certificate read again before a handshake when its files changed; None: plain gRPC."""
    options: list[tuple[str, int]] = [
        # gRPC's own limit sits above the gateway's so that a message over ``max_message_bytes`` reaches the
        # admission step, which refuses it (RESOURCE_EXHAUSTED) and counts it as REST counts a 413. Beyond twice
        # the limit gRPC refuses it itself while it arrives, uncounted, so that no client makes the gateway hold
        # an unbounded message.
        ("grpc.max_receive_message_length", receive_limit(max_message_bytes)),
        # Answers are not the client's to size: a model's outputs may be larger than its inputs (HTTP sends them
        # whole), so gRPC sends any answer a protobuf message can hold, as Triton does (INT32_MAX).
        ("grpc.max_send_message_length", SEND_LIMIT),
        # Off unless the node's workers share the port: else a second gateway on the same port would take half of
        # this one's calls instead of failing to start.
        ("grpc.so_reuseport", 1 if reuse_port else 0),
        ("grpc.max_concurrent_streams", MAX_CONCURRENT_STREAMS),
        # Both limits: gRPC refuses a random share of the calls between its soft and hard one; equal, it refuses
        # every call above them and none below.
        ("grpc.max_metadata_size", max_metadata_bytes),
        ("grpc.absolute_max_metadata_size", max_metadata_bytes),
        *PING_POLICY,
    ]
    # No grpc.max_connection_age_ms (nor its grace): it would cut the long calls (a health Watch, bounded by
    # grpc_health_max_watches; an inference stream, which ends when idle for stream_idle_timeout_s), and a busy
    # connection of unary calls holds nothing long; forcing reconnects would only cost handshakes.
    if connection_idle_s is not None:
        options.append(("grpc.max_connection_idle_ms", max(int(connection_idle_s * 1000), 1)))
    if handshake_timeout_s is not None:
        options.append(("grpc.server_handshake_timeout_ms", max(int(handshake_timeout_s * 1000), 1)))
    server = grpc.aio.server(options=options)
    streams = StreamService(
        dataplane, max_inflight=stream_max_inflight, idle_timeout_s=stream_idle_timeout_s, max_open=stream_max_open
    )
    tracing = dataplane.observer.tracing if dataplane.observer is not None else None
    if tracing is None:
        servicer = InferenceServicer(dataplane, repository=repository, streams=streams)
    else:
        servicer = TracedInferenceServicer(dataplane, repository=repository, streams=streams, tracing=tracing)
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, GenericHandlersOnly(server))
    health = HealthService(dataplane, interval_s=health_interval_s, max_watches=health_max_watches)
    health_pb2_grpc.add_HealthServicer_to_server(health, GenericHandlersOnly(server))
    address = f"{host}:{port}"
    try:
        if tls is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, tls.grpc_credentials())
    except RuntimeError as exc:  # gRPC says only "Failed to bind to address ...; set GRPC_VERBOSITY=debug"
        raise GrpcListenError(
            f"gRPC cannot listen on {address}: the port is in use, or the address is not one of this host's "
            "(SWITCHYARD_GRPC_PORT / --grpc-port, SWITCHYARD_HOST / --host)"
        ) from exc
    await server.start()
    return GatewayServer(server, health, streams), bound
