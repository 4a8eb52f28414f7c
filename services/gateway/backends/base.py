"""The ``Backend`` protocol: what the dataplane needs from whatever actually runs the models."""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Mapping
from typing import Protocol

from tritonclient.grpc import model_config_pb2, service_pb2

from services.gateway.tensors.types import InferRequest, InferResponse, ModelMetadata, VersionState


class Backend(Protocol):
    """Runs model versions. Versions are integers; ``infer`` always gets an explicit one.

    Implementations raise ``GatewayError`` subclasses only (``ModelNotFound``, ``ModelNotReady``,
    ``BackendUnavailable``, ``InferenceFailed``, ``Overloaded``, ``DeadlineExceeded``); translating
    their runtime's own errors is their job.
    """

    shared_server: bool
    """Whether other gateways drive the same model server (Triton): then one replica loads a version and the others
    ``adopt`` it; an embedded backend runs its own copies, and every replica loads them itself."""

    enforces_deadlines: bool
    """Whether ``infer`` itself fails with ``DeadlineExceeded`` once ``timeout_s`` has passed (the embedded batcher's
    timer, Triton's gRPC deadline): then the dataplane arms no timer of its own around the call."""

    forwards_parameters: bool
    """Whether ``infer`` hands a request's own parameters (``InferRequest.parameters``) to the model (Triton passes
    them to its backends, the sequence ones to its sequence batcher); the dataplane refuses them otherwise."""

    runs_model_warmup: bool
    """Whether the model server runs a version's ``model_warmup`` itself as it loads it, each sample ``count`` times
    (Triton): the gateway's warm-up then sends each declared sample once, to check its answer."""

    async def adopt(self, model: str, versions: Collection[int]) -> None:
        """Another gateway changed the model's versions on the shared server: want exactly ``versions`` (what the
        routing record says the gateways keep loaded) from now on, without asking the server for anything."""

    async def start(self, initial: Mapping[str, Collection[int]]) -> None:
        """Open clients / thread pools and load ``initial`` (model -> versions, as the version manager decided
        from the routing state and the version policies). A version that fails to load is reported through
        ``problem``, never raised: the others must still serve."""

    async def close(self) -> None:
        """Stop accepting work, fail what is queued, release resources."""

    async def live(self) -> bool:
        """Whether the backend process/runtime answers at all."""

    def models(self) -> Mapping[str, Mapping[int, VersionState]]:
        """Every model of the catalog, with the state of each version it has loaded or is loading.

        No I/O: a backend keeps this view current itself (the Triton backend from its load/unload calls and a
        periodic repository index).
        """

    def state(self, model: str, version: int) -> VersionState | None:
        """One version's state (``None``: not loaded). Called on every request: a dict lookup, no I/O."""

    def problem(self, model: str, version: int | None = None) -> str | None:
        """Why the model (``version=None``: every version it tried failed, or it cannot run here at all) or one
        version cannot serve, when the backend knows a reason that waiting will not fix; ``None`` otherwise."""

    async def load(self, model: str, version: int) -> None:
        """Load one version beside the others (re-reading its config from the repository) and return once it
        is ready; the version manager warms it up before routing traffic to it."""

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

    def decoupled(self, model: str) -> bool:
        """Whether the model may answer a request with any number of responses (its config's
        ``model_transaction_policy { decoupled: true }``): then the dataplane serves it through ``infer_stream``. Per
        model, not per version: Triton applies one config to every version it loads of a model. No I/O."""

    def infer_stream(
        self, request: InferRequest, *, version: int, timeout_s: float | None, priority: int
    ) -> AsyncIterator[InferResponse]:
        """A decoupled model's responses to one validated request, in the order the model sent them, the last with
        ``final`` set (it may have no outputs: the model said it is done after its last answer). ``timeout_s``
        bounds the whole sequence. A failure, before or between responses, is raised as a ``GatewayError``; closing
        the iterator early cancels the request in the model server."""

    async def statistics(self, model: str | None, version: int | None) -> list[service_pb2.ModelStatistics]:
        """The model server's statistics (Triton's statistics extension) of the ready versions of ``model``
        (``None``: every model of the catalog), or of one ``version``; in (name, version) order."""


def describe_problem(
    model_problem: str | None, failures: Mapping[int, str], serving: bool, version: int | None
) -> str | None:
    """What ``Backend.problem`` answers, from what a backend knows: why the model cannot run at all, why versions
    failed to load, and whether one of its versions serves (then the model as a whole has no problem)."""
    if model_problem is not None:
        return model_problem
    if version is not None:
        return failures.get(version)
    if failures and not serving:
        return "; ".join(f"version {v}: {reason}" for v, reason in sorted(failures.items()))
    return None
