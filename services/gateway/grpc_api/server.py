"""The gRPC listener: a ``grpc.aio`` server on the running loop, with the limits every connection gets."""

from __future__ import annotations

import grpc
from tritonclient.grpc import service_pb2_grpc

from services.gateway.dataplane import DataPlane
from services.gateway.grpc_api.servicer import InferenceServicer


async def start_server(
    dataplane: DataPlane, host: str, port: int, *, max_message_bytes: int
) -> tuple[grpc.aio.Server, int]:
    """Start a ``grpc.aio`` server on the running loop (the same one uvicorn serves HTTP on)."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.so_reuseport", 0),
        ]
    )
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(dataplane), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    return server, bound
