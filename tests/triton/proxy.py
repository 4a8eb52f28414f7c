"""A pass-through gRPC proxy in front of Triton that records every ``ModelInferRequest`` it forwards:
how a test sees exactly what the gateway told Triton (the v2 ``timeout`` and ``priority`` parameters, the
gRPC deadline). With ``hold`` set it keeps inference calls unanswered: a Triton that accepts and hangs."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from tritonclient.grpc import service_pb2

_INFER = "/inference.GRPCInferenceService/ModelInfer"


class RecordingProxy:
    """Forwards unary calls byte for byte to ``target``; ``start()`` returns the port it listens on."""

    def __init__(self, target: str, *, deadline_slack_s: float = 0.0) -> None:
        self._deadline_slack_s = deadline_slack_s
        """Added to a forwarded call's deadline: the proxy's own hop must not eat a budget Triton is to enforce."""
        self._channel = grpc.insecure_channel(target)
        self._server = grpc.server(ThreadPoolExecutor(max_workers=16), handlers=[_Forward(self)])
        self._lock = threading.Lock()
        self.requests: list[Any] = []
        self.deadlines: list[float | None] = []
        """Seconds left of each recorded call's gRPC deadline when it arrived (``None``: no deadline)."""
        self.outcomes: dict[str, str] = {}
        """How Triton answered each forwarded inference request, by request id: ``OK`` or the gRPC status name."""
        self.hold = threading.Event()
        self._released = threading.Event()
        self.port = 0

    def start(self) -> int:
        self.port = int(self._server.add_insecure_port("127.0.0.1:0"))
        self._server.start()
        return self.port

    def stop(self) -> None:
        self._released.set()
        self._server.stop(grace=None)
        self._channel.close()

    def record(self, method: str, payload: bytes, remaining: float | None) -> None:
        if method == _INFER:
            request = service_pb2.ModelInferRequest.FromString(payload)
            with self._lock:
                self.requests.append(request)
                self.deadlines.append(remaining if remaining is not None and remaining < 1e9 else None)  # gRPC: inf

    def forward(self, method: str, payload: bytes, context: grpc.ServicerContext) -> bytes:
        self.record(method, payload, context.time_remaining())
        if method == _INFER and self.hold.is_set():
            self._released.wait(timeout=30)
            context.abort(grpc.StatusCode.UNAVAILABLE, "held by the test proxy")
        call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = self._channel.unary_unary(method)
        remaining = context.time_remaining()
        # A call without a deadline has an infinite one, given as a huge figure: as a timeout it reads as past.
        timeout = remaining + self._deadline_slack_s if remaining is not None and remaining < 1e9 else None
        try:
            response: bytes = call(payload, timeout=timeout)
        except grpc.RpcError as exc:
            self._outcome(method, payload, exc.code().name)
            context.abort(exc.code(), exc.details() or "")
        self._outcome(method, payload, "OK")
        return response

    def _outcome(self, method: str, payload: bytes, outcome: str) -> None:
        if method == _INFER:
            with self._lock:
                self.outcomes[service_pb2.ModelInferRequest.FromString(payload).id] = outcome


class _Forward(grpc.GenericRpcHandler):
    def __init__(self, proxy: RecordingProxy) -> None:
        self._proxy = proxy

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[bytes, bytes] | None:
        method = str(handler_call_details.method)

        def behaviour(payload: bytes, context: grpc.ServicerContext) -> bytes:
            return self._proxy.forward(method, payload, context)

        return grpc.unary_unary_rpc_method_handler(behaviour)
