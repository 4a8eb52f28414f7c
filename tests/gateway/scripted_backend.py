"""A scripted in-memory ``Backend`` for unit tests of the dataplane and the front ends."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

from tritonclient.grpc import model_config_pb2

from services.gateway.errors import ModelNotFound
from services.gateway.types import InferOutput, InferRequest, InferResponse, ModelMetadata, TensorSpec, VersionState


@dataclass
class ScriptedBackend:
    """Implements the ``Backend`` protocol for one model, ``double``: y = 2 * x, x FP32 [-1, 4]."""

    states: dict[int, VersionState] = field(default_factory=lambda: {1: VersionState.READY})
    delay_s: float = 0.0
    failure: Exception | None = None
    """Raised by ``infer``: a ``GatewayError`` the backend means, anything else a bug."""
    calls: list[tuple[int, float | None, int]] = field(default_factory=list)
    started: bool = False
    problems: dict[int | None, str] = field(default_factory=dict)
    """What ``problem()`` answers, keyed by version (``None``: the model as a whole)."""

    async def start(self) -> None:
        self.started = True

    async def close(self) -> None:
        self.started = False

    async def live(self) -> bool:
        return True

    def models(self) -> Mapping[str, Mapping[int, VersionState]]:
        return {"double": dict(self.states)}

    def problem(self, model: str, version: int | None = None) -> str | None:
        return self.problems.get(version)

    async def load(self, model: str, version: int) -> None:
        self.states[version] = VersionState.READY

    async def unload(self, model: str, version: int) -> None:
        self.states.pop(version, None)

    async def ready(self, model: str, version: int) -> bool:
        return self.states.get(version) is VersionState.READY

    async def metadata(self, model: str, version: int) -> ModelMetadata:
        if model != "double":
            raise ModelNotFound(f"unknown model '{model}'")
        return ModelMetadata(
            name="double",
            versions=(version,),
            platform="scripted",
            max_batch_size=8,
            inputs=(TensorSpec("x", "FP32", (4,)),),
            outputs=(TensorSpec("y", "FP32", (4,)), TensorSpec("z", "FP32", (4,))),
        )

    async def config(self, model: str, version: int) -> model_config_pb2.ModelConfig:
        return model_config_pb2.ModelConfig(name="double", max_batch_size=8)

    async def infer(
        self, request: InferRequest, *, version: int, timeout_s: float | None, priority: int
    ) -> InferResponse:
        self.calls.append((version, timeout_s, priority))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.failure is not None:
            raise self.failure
        x = request.inputs[0].data
        return InferResponse(
            "double", version, [InferOutput("y", "FP32", x * 2), InferOutput("z", "FP32", -x)], request.id
        )
