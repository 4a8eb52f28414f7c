"""The floor for any Python HTTP front end: a bare ASGI app under the gateway's own server stack (uvicorn,
httptools, uvloop) that reads the body, parses it with orjson, turns the first input's ``data`` into a float32
array and writes a fixed JSON answer. No routing, no validation, no model, no metrics.

``make bench`` (bench.py) runs it beside the gateway so the gateway's CPU per request reads against what one
HTTP request costs in Python on this machine. Not part of the product.
Usage: ``python loadtests/http_floor.py LISTEN_PORT``.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import orjson
import uvicorn

ANSWER = orjson.dumps(
    {"model_name": "floor", "model_version": "1", "outputs": [{"name": "y", "datatype": "FP32", "shape": [1, 1],
                                                               "data": [0.0]}]}
)
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":  # lifespan: nothing to start
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
            await receive()
            await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["method"] == "GET":  # health: the bench waits for it
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    request = orjson.loads(body)
    np.asarray(request["inputs"][0]["data"], dtype=np.float32)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), loop="uvloop", http="httptools", log_level="warning")
