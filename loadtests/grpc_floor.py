"""The floor for any gateway written in Python: a grpc.aio pass-through of ``ModelInfer`` that forwards the
request's bytes to Triton and Triton's bytes back, parsing nothing, checking nothing, counting nothing.

``make bench`` (bench_triton.py) runs it beside the gateway so the gateway's cost over direct Triton splits
into what one Python gRPC hop costs on this machine and what the gateway adds on top. Not part of the product.
Usage: ``python loadtests/grpc_floor.py TRITON_HOST:PORT LISTEN_PORT``.
"""

from __future__ import annotations

import sys
from typing import Any

import grpc
import uvloop

SERVICE = "inference.GRPCInferenceService"


async def serve(target: str, port: int) -> None:
    channel = grpc.aio.insecure_channel(target)
    # No serializers: bytes in, bytes out (which is also why mypy cannot infer the types).
    forward: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(f"/{SERVICE}/ModelInfer")

    async def model_infer(request: bytes, context: Any) -> bytes:
        return await forward(request)

    handler = grpc.method_handlers_generic_handler(
        SERVICE, {"ModelInfer": grpc.unary_unary_rpc_method_handler(model_infer)}
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print(f"grpc floor proxy on 127.0.0.1:{port} -> {target}", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    uvloop.run(serve(sys.argv[1], int(sys.argv[2])))
