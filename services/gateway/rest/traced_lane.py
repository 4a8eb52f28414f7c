"""The inference lane with a server span per request (``tracing`` on): the same lane, wrapped, so that with tracing
off the lane's own path carries no trace of it."""

from __future__ import annotations

from starlette.types import Message, Receive, Scope, Send

from services.gateway.dataplane import DataPlane
from services.gateway.rest.answer_head import AnswerHeaders
from services.gateway.rest.lane import PROTOCOL, InferLane
from services.gateway.tracing.spans import CURRENT, Tracing

SPAN_NAME = "POST /v2/models/{model_name}/infer"


class TracedInferLane(InferLane):
    def __init__(self, dataplane: DataPlane, *, max_body_bytes: int, tracing: Tracing) -> None:
        super().__init__(dataplane, max_body_bytes=max_body_bytes)
        self._tracing = tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send, model: str, raw_version: str | None) -> None:
        """The caller's ``traceparent`` is the span's parent; the answer carries the span's own, sampled or not."""
        headers: dict[bytes, bytes] = dict(reversed(scope["headers"]))

        def header(name: str) -> str | None:
            value = headers.get(name.encode("latin-1"))
            return None if value is None else value.decode("latin-1")

        attributes = {"switchyard.model": model, "switchyard.protocol": PROTOCOL, "url.path": scope["path"]}
        trace = self._tracing.server(SPAN_NAME, header, attributes)
        traceparent = (b"traceparent", trace.traceparent.encode("latin-1"))
        sent: list[int] = []

        async def traced_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                sent.append(message["status"])
                answer = message.get("headers", ())
                if type(answer) is AnswerHeaders:  # keeps the direct answer's prerendered head
                    answer = AnswerHeaders(
                        answer.length, answer.version, answer.header_length, (*answer.extra, traceparent)
                    )
                else:
                    answer = [*answer, traceparent]
                message = {**message, "headers": answer}
            await send(message)

        token = CURRENT.set(trace)
        try:
            await super().__call__(scope, receive, traced_send, model, raw_version)
        finally:
            CURRENT.reset(token)
            trace.end(sent[0] if sent else None)
