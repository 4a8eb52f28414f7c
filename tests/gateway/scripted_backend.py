"""A scripted in-memory ``Backend`` for unit tests of the dataplane, the router, the version manager and the
front ends, and the repository folder it stands for."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2, service_pb2

from services.gateway.errors import GatewayError, InferenceFailed, unknown_model, unknown_version
from services.gateway.tensors.types import (
    InferOutput,
    InferRequest,
    InferResponse,
    ModelMetadata,
    TensorSpec,
    VersionState,
)

CONFIG = """
name: "double"
platform: "onnxruntime_onnx"
max_batch_size: 8
input { name: "x" data_type: TYPE_FP32 dims: [ 4 ] }
output { name: "y" data_type: TYPE_FP32 dims: [ 4 ] }
output { name: "z" data_type: TYPE_FP32 dims: [ 4 ] }
version_policy { specific { versions: [ 1 ] } }
"""


def double_repository(root: Path, versions: Collection[int] = (1, 2)) -> Path:
    """``double``'s folder as the catalog reads it: the config (its policy serves version 1) and empty model files
    (the backend is scripted)."""
    model = root / "double"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.pbtxt").write_text(CONFIG)
    for version in versions:
        (model / str(version)).mkdir(exist_ok=True)
        (model / str(version) / "model.onnx").write_bytes(b"")
    return root


@dataclass
class ScriptedBackend:
    """Implements the ``Backend`` protocol for one model, ``double``: y = 2 * x, z = -x, x FP32 [-1, 4]. Versions
    load instantly unless listed in ``broken``; ``factor`` changes y per version (2 * x * factor)."""

    states: dict[int, VersionState] = field(default_factory=lambda: {1: VersionState.READY})
    delay_s: float = 0.0
    version_delay_s: dict[int, float] = field(default_factory=dict)
    """A further delay for the versions listed (a slow shadow or canary)."""
    failure: Exception | None = None
    """Raised by ``infer``: a ``GatewayError`` the backend means, anything else a bug."""
    calls: list[tuple[int, float | None, int]] = field(default_factory=list)
    started: bool = False
    problems: dict[int | None, str] = field(default_factory=dict)
    """What ``problem()`` answers, keyed by version (``None``: the model as a whole)."""
    broken: set[int] = field(default_factory=set)
    """Versions whose load fails."""
    wrong_rows: set[int] = field(default_factory=set)
    """Versions that answer one row too many (a warm-up must catch it)."""
    factor: dict[int, float] = field(default_factory=dict)
    failing_when_positive: set[int] = field(default_factory=set)
    """Versions whose answer fails (500) when the request's first value is positive: part of the traffic."""
    load_delay_s: float = 0.0
    hold: asyncio.Event | None = None
    """When given, ``infer`` waits for it once ``calls`` has the request: a request kept in flight until the test
    sets it (instead of a delay guessed to outlast the test's next steps)."""
    load_hold: asyncio.Event | None = None
    """When given, ``load`` waits for it in state LOADING."""
    on_disk: set[int] = field(default_factory=lambda: {1, 2, 3})
    """Versions ``load`` finds (``double_repository`` writes 1 and 2; a test may add 3); others are 404 as in a
    real backend, which reads the repository when it loads."""
    loads: list[int] = field(default_factory=list)
    unloads: list[int] = field(default_factory=list)
    initial: dict[str, set[int]] = field(default_factory=dict)
    """What the gateway asked ``start`` to load (the states stay as the test set them)."""
    extra_config: str = ""
    """Appended to ``CONFIG`` in what ``config`` answers (a ``model_warmup``, say)."""

    shared_server = False

    async def adopt(self, model: str, versions: Collection[int]) -> None:
        pass

    async def start(self, initial: Mapping[str, Collection[int]]) -> None:
        self.started = True
        self.initial = {name: set(versions) for name, versions in initial.items()}

    async def close(self) -> None:
        self.started = False

    async def live(self) -> bool:
        return True

    def models(self) -> Mapping[str, Mapping[int, VersionState]]:
        return {"double": dict(self.states)}

    def state(self, model: str, version: int) -> VersionState | None:
        return self.states.get(version) if model == "double" else None

    def problem(self, model: str, version: int | None = None) -> str | None:
        return self.problems.get(version)

    async def load(self, model: str, version: int) -> None:
        if version not in self.on_disk:
            raise unknown_version("double", version, f"the repository has no version {version} of it")
        self.loads.append(version)
        self.states[version] = VersionState.LOADING
        if self.load_hold is not None:
            await self.load_hold.wait()
        await asyncio.sleep(self.load_delay_s)
        if version in self.broken:
            self.states[version] = VersionState.UNAVAILABLE
            raise GatewayError(f"loading model 'double' version {version} failed: not a model", 503)
        self.states[version] = VersionState.READY

    async def unload(self, model: str, version: int) -> None:
        self.unloads.append(version)
        self.states.pop(version, None)

    async def ready(self, model: str, version: int) -> bool:
        return self.states.get(version) is VersionState.READY

    async def metadata(self, model: str, version: int) -> ModelMetadata:
        if model != "double":
            raise unknown_model(model)
        return ModelMetadata(
            name="double",
            versions=(version,),
            platform="scripted",
            max_batch_size=8,
            inputs=(TensorSpec("x", "FP32", (4,)),),
            outputs=(TensorSpec("y", "FP32", (4,)), TensorSpec("z", "FP32", (4,))),
        )

    async def config(self, model: str, version: int) -> model_config_pb2.ModelConfig:
        return text_format.Parse(CONFIG + self.extra_config, model_config_pb2.ModelConfig())

    def decoupled(self, model: str) -> bool:
        return False  # "double" answers each request once

    async def infer(
        self, request: InferRequest, *, version: int, timeout_s: float | None, priority: int
    ) -> InferResponse:
        self.calls.append((version, timeout_s, priority))
        if self.hold is not None:
            await self.hold.wait()
        if self.state(request.model, version) is None:  # as a real backend: a version unloaded meanwhile is not found
            raise unknown_version(request.model, version, "not loaded")
        if self.delay_s or version in self.version_delay_s:
            await asyncio.sleep(self.delay_s + self.version_delay_s.get(version, 0.0))
        if self.failure is not None:
            raise self.failure
        x = request.inputs[0].data
        if version in self.failing_when_positive and x.flat[0] > 0:
            raise InferenceFailed(f"version {version} cannot take positive inputs")
        if version in self.wrong_rows:
            x = x.repeat(2, axis=0)
        y = x * 2 * self.factor.get(version, 1.0)
        return InferResponse("double", version, [InferOutput("y", "FP32", y), InferOutput("z", "FP32", -x)], request.id)

    async def statistics(self, model: str | None, version: int | None) -> list[service_pb2.ModelStatistics]:
        """Each ready version with the calls ``infer`` saw as its execution count."""
        if model not in (None, "double"):
            return []
        return [
            service_pb2.ModelStatistics(
                name="double", version=str(v), execution_count=sum(1 for call in self.calls if call[0] == v)
            )
            for v, state in sorted(self.states.items())
            if state is VersionState.READY and version in (None, v)
        ]
