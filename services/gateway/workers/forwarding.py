"""On the workers other than worker 0: the admin API, the console's calls and the repository extension go to worker 0,
which runs every version action of the node (one routing state, one lock per model, one audit log). The answer is
worker 0's, status and body as they came."""

from __future__ import annotations

import json
from typing import Any

import httpx
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.gateway.errors import BackendUnavailable, GatewayError
from services.gateway.versions.progress import ActionReport
from services.gateway.workers.peers import ACTION_TIMEOUT_S, Peers, WorkerDown, failure
from services.gateway.workers.place import ACTING

FORWARDED = ("/admin", "/v2/repository")
"""Path prefixes worker 0 answers for the node."""
_HOP_HEADERS = {b"host", b"content-length", b"transfer-encoding", b"connection", b"keep-alive"}
DOWN = (
    "worker 0, which runs this node's version actions, is not running (the supervisor restarts it); "
    "retry in a few seconds"
)


class ForwardToActingWorker:
    """An ASGI app in front of the gateway's own: forwarded prefixes go to worker 0, the rest is served here. The
    lane (the fast inference path the HTTP protocol starts directly) is the gateway's."""

    def __init__(self, gateway: Any, peers: Peers, *, max_body_bytes: int) -> None:
        self._gateway: ASGIApp = gateway
        self.lane = getattr(gateway, "lane", None)
        self.state = gateway.state
        self._peers = peers
        self._max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(FORWARDED):
            await self._gateway(scope, receive, send)
            return
        body = await _body(receive, self._max_body_bytes)
        if body is None:  # worker 0 would refuse it too; not sent there
            limit = f"request body exceeds the {self._max_body_bytes} byte limit"
            await _answer(send, 413, _error(limit), [])
            return
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP_HEADERS]
        target = scope["path"] + (f"?{scope['query_string'].decode()}" if scope.get("query_string") else "")
        try:
            answer = await self._peers.call(ACTING, scope["method"], target, timeout_s=ACTION_TIMEOUT_S,
                                            content=body, headers=headers)
        except WorkerDown:
            await _answer(send, 503, _error(DOWN), [(b"retry-after", b"2")])
            return
        except httpx.HTTPError as exc:
            why = failure(exc, ACTION_TIMEOUT_S)
            await _answer(send, 502, _error(f"worker 0 did not answer the forwarded call: {why}"), [])
            return
        kept = [(k.encode(), v.encode()) for k, v in answer.headers.items() if k.encode() not in _HOP_HEADERS]
        await _answer(send, answer.status_code, answer.content, kept)


def _error(message: str) -> bytes:
    """The gateway's error body (``rest/responses.py``'s shape)."""
    return json.dumps({"error": message}).encode()


async def _body(receive: Receive, limit: int) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    while True:
        message: Message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _answer(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    if not any(k == b"content-type" for k, _ in headers):
        headers = [*headers, (b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def repository_forward(peers: Peers) -> Any:
    """``RepositoryApi.forward`` for the gRPC repository calls of a worker other than worker 0."""

    async def forward(kind: str, model: str, override: str | None, actor: str) -> ActionReport:
        try:
            answer = await peers.call(ACTING, "POST", "/peer/repository", timeout_s=ACTION_TIMEOUT_S,
                                      json={"kind": kind, "model": model, "override": override, "actor": actor})
        except WorkerDown:
            raise BackendUnavailable(DOWN) from None
        data = answer.json()
        if answer.status_code != 200:
            raise GatewayError(str(data.get("error", answer.text)), answer.status_code)
        return ActionReport(model, data["action"], data["result"], data["versions"], data["steps"],
                            note=data.get("note"), error=data.get("error"), workers=data.get("workers", {}))

    return forward
