"""The gRPC inference user: KServe v2 ``ModelInfer`` through the generated stubs shipped in ``tritonclient.grpc``,
each call in locust's stats (request type ``grpc``) and each answer checked like the HTTP user's."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np
from grpc.experimental import gevent as grpc_gevent
from kserve_tensors import (
    ModelSpec,
    ServedVersions,
    WrongAnswer,
    check_model,
    check_output,
    check_outputs_named,
    check_raw_size,
    random_inputs,
    raw_bytes,
)
from load_options import LoadOptions
from locust import User, task
from locust.exception import StopUser
from request_events import fire_failure, fire_request
from tritonclient.grpc import service_pb2, service_pb2_grpc

# grpcio blocks in C: without this a call would stall every other user of this locust process until it returns.
grpc_gevent.init_gevent()

SAMPLES = 4
RETRY_S = 1.0
TIMEOUT_S = 30.0


class GrpcCallFailed(Exception):
    """A call ended with a gRPC status other than OK; the message is the status and its details."""


class GrpcUser(User):
    weight = 1

    options: LoadOptions
    spec: ModelSpec | None = None
    versions: ServedVersions
    requests: list[Any]
    turn = 0

    def wait_time(self) -> float:
        return self.options.think_s if self.spec is not None else RETRY_S

    def on_start(self) -> None:
        self.options = LoadOptions.of(self.environment)
        self.metadata = self.options.grpc_metadata()
        self.channel = grpc.insecure_channel(self.options.grpc_target.address)
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)

    def on_stop(self) -> None:
        self.channel.close()

    @task
    def infer(self) -> None:
        if self.spec is None and not self._read_spec():
            return
        request = self.requests[self.turn % SAMPLES]
        self.turn += 1
        self._call("grpc-infer", lambda: self.stub.ModelInfer(request, timeout=TIMEOUT_S, metadata=self.metadata))

    def _check(self, response: Any) -> None:
        assert self.spec is not None
        check_model(self.spec, response.model_name)
        check_outputs_named(self.spec, (output.name for output in response.outputs))
        if len(response.raw_output_contents) != len(response.outputs):
            raise WrongAnswer(f"{len(response.outputs)} outputs with {len(response.raw_output_contents)} raw contents")
        for output, raw in zip(response.outputs, response.raw_output_contents, strict=True):
            count = check_output(self.spec, self.options.rows, output.name, output.datatype, list(output.shape))
            check_raw_size(output.name, output.datatype, count, raw)
        self.versions.check(response.model_version)

    def _call(self, name: str, call: Callable[[], Any], check: bool = True) -> Any | None:
        """One call in the stats; ``None`` when it failed (and the failure is in the stats)."""
        started = time.perf_counter()
        try:
            response = call()
        except grpc.RpcError as exc:
            elapsed_ms = (time.perf_counter() - started) * 1e3
            fire_request(self.environment, "grpc", name, elapsed_ms, 0, GrpcCallFailed(self._status(exc)))
            return None
        elapsed_ms = (time.perf_counter() - started) * 1e3
        # The answer is checked after the clock stopped: the check's CPU time is the load generator's, not the call's.
        failure: BaseException | None = None
        if check:
            try:
                self._check(response)
            except (WrongAnswer, ValueError, KeyError, TypeError) as exc:
                failure = WrongAnswer(f"wrong answer: {type(exc).__name__}: {exc}")
        fire_request(self.environment, "grpc", name, elapsed_ms, response.ByteSize(), failure)
        return response if failure is None else None

    def _status(self, exc: grpc.RpcError) -> str:
        if not isinstance(exc, grpc.Call):
            return str(exc)
        status = f"{exc.code().name}: {exc.details()}"
        if exc.code() != grpc.StatusCode.UNAVAILABLE:
            return status
        # The gateway answers UNAVAILABLE too (not ready, overloaded), but a wrong port is the first-hour case: name
        # the target and how it was found, which the gates' lines repeat.
        target = self.options.grpc_target
        return (
            f"{status} (gRPC target {target.address}, {target.rule}; "
            "if that is not the gateway's gRPC port, set GRPC_TARGET=HOST:PORT)"
        )

    def _read_spec(self) -> bool:
        model = self.options.model
        metadata = self._call(
            "grpc-metadata",
            lambda: self.stub.ModelMetadata(
                service_pb2.ModelMetadataRequest(name=model), timeout=TIMEOUT_S, metadata=self.metadata
            ),
            check=False,
        )
        config = self._call(
            "grpc-config",
            lambda: self.stub.ModelConfig(
                service_pb2.ModelConfigRequest(name=model), timeout=TIMEOUT_S, metadata=self.metadata
            ),
            check=False,
        )
        if metadata is None or config is None:
            return False
        try:
            spec = ModelSpec.from_metadata(_metadata_json(metadata), int(config.config.max_batch_size))
            rng = np.random.default_rng()
            samples = [random_inputs(spec, self.options.rows, self.options.dims, rng) for _ in range(SAMPLES)]
        except (ValueError, KeyError, TypeError) as exc:
            fire_failure(self.environment, "grpc", "grpc-metadata", exc)  # see InferenceUser._read_spec
            raise StopUser() from exc
        self.requests = [_infer_request(spec, arrays) for arrays in samples]
        self.versions = ServedVersions(spec.versions, self._served)
        self.spec = spec
        return True

    def _served(self) -> list[str]:
        request = service_pb2.ModelMetadataRequest(name=self.options.model)
        metadata = self._call(
            "grpc-metadata",
            lambda: self.stub.ModelMetadata(request, timeout=TIMEOUT_S, metadata=self.metadata),
            check=False,
        )
        return [] if metadata is None else list(metadata.versions)


def _metadata_json(metadata: Any) -> dict[str, Any]:
    """The gRPC metadata as the REST route gives it (``MessageToDict`` would turn the int64 dims into strings)."""

    def tensors(specs: Any) -> list[dict[str, Any]]:
        return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in specs]

    return {
        "name": metadata.name,
        "versions": list(metadata.versions),
        "inputs": tensors(metadata.inputs),
        "outputs": tensors(metadata.outputs),
    }


def _infer_request(spec: ModelSpec, arrays: dict[str, np.ndarray]) -> Any:
    request = service_pb2.ModelInferRequest(model_name=spec.name)
    for tensor in spec.inputs:
        array = arrays[tensor.name]
        request.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=list(array.shape))
        request.raw_input_contents.append(raw_bytes(array))
    return request
