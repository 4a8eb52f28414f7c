"""The floor for any Python HTTP front end: a bare ASGI app under the gateway's own server stack (uvicorn,
httptools, uvloop) that reads the body, parses it with orjson, turns the first input's ``data`` into a float32
array and writes a fixed JSON answer. No routing, no validation, no model, no metrics.

``make bench`` (bench.py) runs it beside the gateway so the gateway's CPU per request reads against what one
HTTP request costs in Python on this machine. ``--binary`` takes requests in the binary tensor extension instead
(the JSON header parsed, the tensor's bytes viewed by numpy), and ``--answer-after-ms`` holds each answer back so
that a closed loop of clients runs at a chosen rate: front_end_bound.py uses both. Not part of the product.
Usage: ``python loadtests/http_floor.py LISTEN_PORT [--binary] [--answer-after-ms MS]``.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import orjson
import uvicorn

ANSWER = orjson.dumps(
    {"model_name": "floor", "model_version": "1", "outputs": [{"name": "y", "datatype": "FP32", "shape": [1, 1],
                                                               "data": [0.0]}]}
)
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]
App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":  # lifespan: nothing to start
        await _lifespan(receive, send)
        return
    if scope["method"] == "GET":  # health: the bench waits for it
        await _empty(send)
        return
    body = b""  # read here, not through _body: the floor's cost per request stays what bench runs compared with
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    request = orjson.loads(body)
    np.asarray(request["inputs"][0]["data"], dtype=np.float32)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})


def binary_app(answer_after_s: float) -> App:
    """The floor for binary-extension requests (a JSON header of ``Inference-Header-Content-Length`` bytes, then
    the first input's raw bytes), each answered ``answer_after_s`` after it was read."""

    async def serve(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await _lifespan(receive, send)
            return
        if scope["method"] == "GET":
            await _empty(send)
            return
        body = await _body(receive)
        length = int(dict(scope["headers"])[b"inference-header-content-length"])
        orjson.loads(body[:length])
        np.frombuffer(body, dtype=np.float32, offset=length)
        if answer_after_s:
            await asyncio.sleep(answer_after_s)
        await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
        await send({"type": "http.response.body", "body": ANSWER})

    return serve


async def _body(receive: Any) -> bytes:
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    return body


async def _lifespan(receive: Any, send: Any) -> None:
    message = await receive()
    if message["type"] == "lifespan.startup":
        await send({"type": "lifespan.startup.complete"})
        await receive()
        await send({"type": "lifespan.shutdown.complete"})


async def _empty(send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("port", type=int)
    parser.add_argument("--binary", action="store_true", help="binary tensor extension requests, not JSON")
    parser.add_argument("--answer-after-ms", type=float, default=0.0, help="hold each binary answer back this long")
    args = parser.parse_args()
    served = binary_app(args.answer_after_ms / 1e3) if args.binary else app
    uvicorn.run(served, host="127.0.0.1", port=args.port, loop="uvloop", http="httptools", log_level="warning")
