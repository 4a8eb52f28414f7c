"""``RepositoryApi``: what the REST and gRPC front ends call for the model-repository extension. It checks who
calls and the request's parameters, then runs the action; the front ends only translate."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

from services.gateway.errors import InvalidInput
from services.gateway.repository_api.actions import RepositoryActions
from services.gateway.repository_api.auth import RepositoryAuth
from services.gateway.repository_api.index import IndexEntry, repository_index
from services.gateway.versions.progress import ActionReport

if TYPE_CHECKING:
    from services.gateway.versions.manager import VersionManager

Parameter = bool | int | str | bytes
"""A request parameter's value: a JSON scalar on HTTP, one of ``ModelRepositoryParameter``'s fields on gRPC."""
CONFIG = "config"
FILE_PREFIX = "file:"
UNLOAD_DEPENDENTS = "unload_dependents"

Forward = Callable[[str, str, str | None, str], Awaitable[ActionReport]]
"""Runs a load or unload elsewhere: (``"load"`` or ``"unload"``, model, config override, actor) -> its report. A
worker of a node whose version actions run on worker 0 hands its repository actions there."""


class RepositoryApi:
    def __init__(self, manager: VersionManager, auth: RepositoryAuth) -> None:
        self._manager = manager
        self._auth = auth
        self._actions = RepositoryActions(manager)
        self.forward: Forward | None = None
        """Set on a worker that hands its actions to worker 0 (``serve --workers N``); checked here first."""

    def authorize(self, authorization: str | None, *, operator: bool = True) -> str:
        """The caller's name for the audit log; 401 / 403 when it may not call the repository API (``operator``:
        a load or unload, which a read-only admin token may not ask for)."""
        return self._auth.check(authorization, operator=operator)

    def index(self, *, ready_only: bool, visible: Callable[[str], bool] = lambda model: True) -> list[IndexEntry]:
        """``visible``: the models the caller's API key may see; the others are left out as if absent."""
        found = repository_index(self._manager, self._actions.unloading, ready_only=ready_only)
        return [entry for entry in found if visible(entry.name)]

    async def load(self, model: str, parameters: Mapping[str, Parameter], actor: str) -> ActionReport:
        """Load or reload ``model`` (a ``config`` parameter overrides its config.pbtxt for this load)."""
        override = None
        for name, value in parameters.items():
            if name == CONFIG:
                if not isinstance(value, str):
                    raise InvalidInput(
                        f"the '{CONFIG}' parameter must be a string holding the model configuration as JSON, "
                        f"got {type(value).__name__}"
                    )
                override = value
            elif name.startswith(FILE_PREFIX):
                raise InvalidInput(
                    f"file overrides ('{FILE_PREFIX}...' parameters, here {name!r}) are not supported: the gateway "
                    f"loads model files from its repository only; put them in the repository's '{model}' folder "
                    "and load again"
                )
            else:
                raise InvalidInput(f"unknown load parameter {name!r}; expected: '{CONFIG}'")
        if self.forward is not None:
            return await self.forward("load", model, override, actor)
        return await self._actions.load(model, override, actor)

    async def unload(self, model: str, parameters: Mapping[str, Parameter], actor: str) -> ActionReport:
        """Drain and unload every version of ``model``. ``unload_dependents`` is accepted and has nothing to do:
        the gateway serves no ensembles."""
        for name, value in parameters.items():
            if name != UNLOAD_DEPENDENTS:
                raise InvalidInput(f"unknown unload parameter {name!r}; expected: '{UNLOAD_DEPENDENTS}'")
            if not isinstance(value, bool):
                raise InvalidInput(f"the '{UNLOAD_DEPENDENTS}' parameter must be true or false, got {value!r}")
        if self.forward is not None:
            return await self.forward("unload", model, None, actor)
        return await self._actions.unload(model, actor)

    async def run(self, kind: str, model: str, override: str | None, actor: str) -> ActionReport:
        """A load or unload handed over by another worker of the node (its checks done there)."""
        if kind == "load":
            return await self._actions.load(model, override, actor)
        return await self._actions.unload(model, actor)
