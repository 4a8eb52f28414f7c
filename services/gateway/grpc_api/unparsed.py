"""A gRPC message that does not parse as its method's request type is the client's error: INVALID_ARGUMENT saying
so, as any malformed request is answered. Left to gRPC, the deserializer's exception would be an UNKNOWN
"Unexpected <class 'DecodeError'>" and a logged traceback for every such message a client sends.

The methods' deserializers hand an ``Unparsed`` stand-in to the method instead of raising. The inference methods
(``ModelInfer``, ``ModelStreamInfer``) take it through their admission step like any request, and the codec refuses
it where it decodes (so it is counted, and a stream answers it on the stream and goes on); every other method is
wrapped here to refuse it before it runs."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

_INFERENCE = "/inference.GRPCInferenceService/"
SELF_CHECKED = frozenset({_INFERENCE + "ModelInfer", _INFERENCE + "ModelStreamInfer"})
"""The methods whose servicer refuses an ``Unparsed`` request itself (``codec.decode_request``)."""

_CAUSES = "bytes that are not protobuf's wire format, or a string field that is not UTF-8"
Parser = Callable[[bytes], Any]
Context = grpc.aio.ServicerContext[Any, Any]


class Unparsed:
    """Stands in for a request message that did not parse: an inference call's admission step reads its size and
    an empty model name, version and id from it, as from an empty message."""

    __slots__ = ("message", "_size")

    model_name = model_version = id = ""

    def __init__(self, message: str, size: int) -> None:
        self.message = message
        """The error to answer: what came and what was expected."""
        self._size = size

    def ByteSize(self) -> int:  # noqa: N802 (protobuf's name: the admission step reads a message's size so)
        return self._size


def tolerant_handler(method: str, handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
    """``handler`` with a deserializer that hands over an ``Unparsed`` stand-in rather than raising, and (unless the
    servicer checks for it itself) a behaviour that refuses that stand-in; a kind of method not covered here is
    left as it is."""
    parse = handler.request_deserializer
    if parse is None:
        return handler
    if method in SELF_CHECKED:
        return _replaced(handler, request_deserializer=_tolerant(parse))
    # grpc's stubs type the behaviours as the synchronous server's; grpc.aio's are coroutines and async generators
    unary: Any = handler.unary_unary
    streamed: Any = handler.unary_stream
    if not handler.request_streaming and not handler.response_streaming:
        return _replaced(handler, request_deserializer=_tolerant(parse), unary_unary=_unary(unary))
    if not handler.request_streaming:
        return _replaced(handler, request_deserializer=_tolerant(parse), unary_stream=_streamed(streamed))
    return handler


def _replaced(handler: grpc.RpcMethodHandler[Any, Any], **fields: Any) -> grpc.RpcMethodHandler[Any, Any]:
    replaced: grpc.RpcMethodHandler[Any, Any] = handler._replace(**fields)  # type: ignore[attr-defined]
    return replaced


def _tolerant(parse: Parser) -> Parser:
    expected = _type_name(parse)

    def parsed(raw: bytes) -> Any:
        try:
            return parse(raw)
        except DecodeError as exc:
            why = f"the request message ({len(raw)} bytes) is not a serialized {expected} ({_CAUSES}): {exc}"
            return Unparsed(why, len(raw))

    return parsed


def _type_name(parse: Parser) -> str:
    """The protobuf type a generated deserializer (``Message.FromString``) parses."""
    descriptor = getattr(getattr(parse, "__self__", None), "DESCRIPTOR", None)
    return str(getattr(descriptor, "full_name", "protobuf message of the method's request type"))


def _unary(behaviour: Callable[[Any, Context], Awaitable[Any]]) -> Callable[[Any, Context], Awaitable[Any]]:
    async def call(request: Any, context: Context) -> Any:
        if type(request) is Unparsed:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        return await behaviour(request, context)

    return call


def _streamed(
    behaviour: Callable[[Any, Context], AsyncGenerator[Any, None]],
) -> Callable[[Any, Context], AsyncIterator[Any]]:
    async def stream(request: Any, context: Context) -> AsyncIterator[Any]:
        if type(request) is Unparsed:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        # aclosing: when the call ends early, the method's own generator ends with it (its ``finally`` runs now).
        async with contextlib.aclosing(behaviour(request, context)) as answers:
            async for answer in answers:
                yield answer

    return stream
