"""The floors for any gateway written in Python, over gRPC (grpc.aio, the server the gateway runs):

- ``pass-through``: forwards each ``ModelInfer`` request's bytes to Triton and Triton's bytes back, parsing nothing,
  checking nothing, counting nothing: what one Python gRPC hop costs in front of Triton (bench_triton.py).
- ``answer``: parses each request into the protobuf message, reads its first input as a float32 numpy array and
  answers a prebuilt response: what a gRPC inference call costs in Python before any model runs (bench.py). The same
  server answers ``ModelStreamInfer`` the same way, each request message on a stream with a prebuilt stream response:
  what a request on an open stream costs in Python, without a call's setup.

``make bench`` runs them beside the gateway so that the gateway's cost splits into what the Python gRPC stack costs
on this machine and what the gateway adds on top. Not part of the product.
Usage: ``python loadtests/grpc_floor.py TRITON_HOST:PORT LISTEN_PORT`` or ``python loadtests/grpc_floor.py
--answer LISTEN_PORT``.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
import uvloop
from tritonclient.grpc import service_pb2

SERVICE = "inference.GRPCInferenceService"


def _response() -> Any:
    response = service_pb2.ModelInferResponse(model_name="floor", model_version="1")
    response.outputs.add(name="y", datatype="FP32", shape=[1, 1])
    response.raw_output_contents.append(np.zeros(1, np.float32).tobytes())
    return response


def _stream_answer() -> bytes:
    """A stream's answer carries the final-response flag, as the gateway's and Triton's do."""
    message = service_pb2.ModelStreamInferResponse()
    message.infer_response.CopyFrom(_response())
    message.infer_response.parameters["triton_final_response"].bool_param = True
    return bytes(message.SerializeToString())


async def serve(port: int, target: str | None) -> None:
    if target is not None:
        channel = grpc.aio.insecure_channel(target)
        # No serializers: bytes in, bytes out (which is also why mypy cannot infer the types).
        forward: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(f"/{SERVICE}/ModelInfer")

        async def model_infer(request: bytes, context: Any) -> bytes:
            return await forward(request)

        handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
            "ModelInfer": grpc.unary_unary_rpc_method_handler(model_infer)
        }
    else:
        answer = bytes(_response().SerializeToString())
        stream_answer = _stream_answer()

        async def answered(request: Any, context: Any) -> bytes:
            np.frombuffer(request.raw_input_contents[0], dtype=np.float32)
            return answer

        async def streamed(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[bytes]:
            async for request in requests:
                np.frombuffer(request.raw_input_contents[0], dtype=np.float32)
                yield stream_answer

        parse = service_pb2.ModelInferRequest.FromString
        handlers = {
            "ModelInfer": grpc.unary_unary_rpc_method_handler(answered, request_deserializer=parse),
            "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(streamed, request_deserializer=parse),
        }
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print(f"grpc floor on 127.0.0.1:{port} ({'-> ' + target if target else 'answering itself'})", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    if sys.argv[1] == "--answer":
        uvloop.run(serve(int(sys.argv[2]), None))
    else:
        uvloop.run(serve(int(sys.argv[2]), sys.argv[1]))
