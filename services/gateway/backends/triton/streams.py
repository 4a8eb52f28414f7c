"""Decoupled models through Triton: one gateway request becomes one ``ModelStreamInfer`` call, whose responses come
back in the order the model sent them, ``triton_final_response`` on the last.

One Triton stream per request, not one stream per channel shared by every request: on a shared stream one slow
reader (a client reading its tokens slowly) would hold back, through gRPC flow control, the responses of every other
request; a request's deadline could not be its call's deadline; and cancelling one request (its client went away)
would need Triton's request cancellation on a stream the others still use. A call of its own gives each request its
own flow control, deadline and cancellation, with responses that need no matching by id. Its setup costs about a
unary call, paid once for all the responses of the request. Models that answer once never come here (``calls.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
from tritonclient.grpc import service_pb2

from services.gateway.backends.triton.codec import infer_request, infer_response
from services.gateway.backends.triton.errors import TritonErrors
from services.gateway.errors import DeadlineExceeded, InferenceFailed
from services.gateway.tensors.types import InferRequest, InferResponse

FINAL = "triton_final_response"
"""The response parameter Triton sets true on the last response to a request."""
EMPTY_FINAL = "triton_enable_empty_final_response"
"""Asks Triton to send the final flag even when the model sends it on its own, after its last response or with none
at all: without it the gateway could not tell a request that is over from a model that is slow."""


def stream_request(
    request: InferRequest, version: int, timeout_s: float | None, priority: int
) -> service_pb2.ModelInferRequest:
    """The request as Triton's stream takes it: the unary message, with the empty final response asked for."""
    message = infer_request(request, version, timeout_s, priority)
    message.parameters[EMPTY_FINAL].bool_param = True
    return message


async def read_responses(
    call: Any, request: InferRequest, version: int, *, errors: TritonErrors, timeout_s: float | None, silence_s: float
) -> AsyncIterator[InferResponse]:
    """Every response Triton sends on ``call`` (a ``ModelStreamInfer`` call whose one request is written), until
    the final one. ``timeout_s``: the call's own gRPC deadline bounds the sequence; without one, ``silence_s`` bounds
    the wait for each response, a net against a Triton that accepts the call and never answers."""
    model = request.model
    while True:
        try:
            if timeout_s is None:
                async with asyncio.timeout(silence_s):
                    reply = await call.read()
            else:
                reply = await call.read()
        except TimeoutError:
            errors.breaker.record_failure()  # a Triton that sits on a stream this long is not healthy
            raise DeadlineExceeded(f"Triton sent model '{model}' nothing for {silence_s:g} s") from None
        except grpc.RpcError as exc:
            raise errors.rpc_error(exc, model, version, timeout_s) from None
        if reply is grpc.aio.EOF:
            errors.breaker.record_failure()
            raise InferenceFailed(f"Triton ended the stream of model '{model}' version {version} before its final "
                                  "response")
        if reply.error_message:
            # Triton gives no status on a stream: the message is all it says (a model's error, mostly).
            raise errors.infer_error("UNKNOWN", reply.error_message, model, version, timeout_s)
        answer = reply.infer_response
        response = infer_response(answer, request, version)
        final = answer.parameters[FINAL].bool_param if FINAL in answer.parameters else True
        response.final = final
        yield response
        if final:
            return
