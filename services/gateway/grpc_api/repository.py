"""gRPC methods of the model-repository extension (``RepositoryIndex``, ``RepositoryModelLoad``,
``RepositoryModelUnload``): messages to ``RepositoryApi`` calls and back. The caller's token comes in the
``authorization`` metadata (``Bearer <token>``), as on HTTP."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tritonclient.grpc import service_pb2

from services.gateway.errors import InvalidInput
from services.gateway.repository_api import RepositoryApi
from services.gateway.repository_api.api import Parameter

Lookup = Callable[[str], str | None]
"""Reads one metadata key of the call."""
VisibleModels = Callable[[str | None], Callable[[str], bool]]
"""The models an API key (or none) may see, as a test on a model's name."""


class RepositoryService:
    """``repository_name`` is accepted and not looked at: the gateway serves one repository."""

    def __init__(self, api: RepositoryApi) -> None:
        self._api = api

    async def index(self, request: Any, metadata: Lookup, visible_models: VisibleModels) -> Any:
        """``visible_models``: the shaper's check of the caller's API key, if it sent one (after the token's): the
        index shows only the models that key may see."""
        self._api.authorize(metadata("authorization"), operator=False)
        visible = visible_models(metadata("x-api-key"))
        found = self._api.index(ready_only=bool(request.ready), visible=visible)
        entries = [
            service_pb2.RepositoryIndexResponse.ModelIndex(
                name=entry.name, version=entry.version, state=entry.state, reason=entry.reason
            )
            for entry in found
        ]
        return service_pb2.RepositoryIndexResponse(models=entries)

    async def load(self, request: Any, metadata: Lookup) -> Any:
        actor = self._api.authorize(metadata("authorization"))
        await self._api.load(request.model_name, _parameters(request), actor)
        return service_pb2.RepositoryModelLoadResponse()

    async def unload(self, request: Any, metadata: Lookup) -> Any:
        actor = self._api.authorize(metadata("authorization"))
        await self._api.unload(request.model_name, _parameters(request), actor)
        return service_pb2.RepositoryModelUnloadResponse()


def _parameters(request: Any) -> dict[str, Parameter]:
    """Each ``ModelRepositoryParameter`` as the value its set field holds."""
    found: dict[str, Parameter] = {}
    for name, parameter in request.parameters.items():
        which = parameter.WhichOneof("parameter_choice")
        if which is None:
            raise InvalidInput(f"parameter {name!r} has no value")
        found[name] = getattr(parameter, which)
    return found
