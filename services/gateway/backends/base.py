"""The ``Backend`` protocol: what the dataplane needs from whatever actually runs the models."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from tritonclient.grpc import model_config_pb2

from services.gateway.types import InferRequest, InferResponse, ModelMetadata, VersionState


class Backend(Protocol):
    """Runs model versions. Versions are integers; ``infer`` always gets an explicit one.

    Implementations raise ``GatewayError`` subclasses only (``ModelNotFound``, ``ModelNotReady``,
    ``BackendUnavailable``, ``InferenceFailed``, ``Overloaded``, ``DeadlineExceeded``); translating
    their runtime's own errors is their job.
    """

    async def start(self) -> None:
        """Open clients / thread pools and load every version the repository's policies select."""

    async def close(self) -> None:
        """Stop accepting work, fail what is queued, release resources."""

    async def live(self) -> bool:
        """Whether the backend process/runtime answers at all."""

    def models(self) -> Mapping[str, Mapping[int, VersionState]]:
        """Every model the backend knows of, with the state of each version it has loaded or is loading.

        Called on every request to route it, so it does no I/O: a backend keeps this view current
        itself (the Triton backend from its load/unload calls and a periodic repository index).
        """

    def problem(self, model: str, version: int | None = None) -> str | None:
        """Why the model (``version=None``: every version it tried failed, or it cannot run here at all) or one
        version cannot serve, when the backend knows a reason that waiting will not fix; ``None`` otherwise."""

    async def load(self, model: str, version: int) -> None:
        """Load one version beside the others and return once it is warmed up and ready."""

    async def unload(self, model: str, version: int) -> None:
        """Unload one version once its in-flight requests have finished."""

    async def ready(self, model: str, version: int) -> bool:
        """Whether this version answers inference requests now."""

    async def metadata(self, model: str, version: int) -> ModelMetadata:
        """Inputs/outputs/platform of one version; raises ``ModelNotFound`` if unknown."""

    async def config(self, model: str, version: int) -> model_config_pb2.ModelConfig:
        """The model configuration (``config.pbtxt``) the version was loaded with."""

    async def infer(
        self, request: InferRequest, *, version: int, timeout_s: float | None, priority: int
    ) -> InferResponse:
        """Run one validated request on ``version``.

        ``timeout_s`` is the deadline budget left (``None``: no deadline), ``priority`` the client's
        v2 priority (0 = default; lower numbers first, as in Triton). Outputs are all the model's
        outputs, arrays with the batch dim first; the dataplane picks the requested ones.
        """
