"""Where trial configs run: beside the serving model, under a private name, in a runtime of their own.

The embedded host is a second ``EmbeddedBackend`` over a private, temporary repository that holds only the trial
(its config and a hard link to the version's model file); the Triton host (``backends.triton.trials``) loads the
trial into the same Triton under its private name with a complete config override and the model file sent along.
Either way the trial is never in the gateway's catalog: not routed, not in ``/v2`` or the repository index, not in
the state store, and without a metrics registry, so no label ever names it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import Awaitable
from pathlib import Path
from typing import Protocol

from tritonclient.grpc import model_config_pb2 as mc

from services.gateway.backends.embedded_settings import embedded_backend
from services.gateway.errors import GatewayError
from services.gateway.repository import Catalog, ModelEntry
from services.gateway.settings import Settings
from services.gateway.tensors.types import InferInput, InferRequest
from services.modelrepo import layout
from services.modelrepo.config import to_text

TRIAL_PREFIX = "switchyard-tune-"
"""Trial model names start with this; the rest is the model's name and the trial number."""


def trial_name(model: str, number: int) -> str:
    return f"{TRIAL_PREFIX}{model}-{number}"


async def to_the_end(work: Awaitable[None]) -> None:
    """Runs ``work`` (a host's load, unload or close) to its end even when the run is cancelled meanwhile, then
    passes the cancellation on: cut short, an unload would leave a trial loaded (in place: the trial's config
    serving production) with nothing left to unload it, and a load would leave one its unload does not know of."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():  # the work's own cancellation, not this caller's
                raise
            cancelled = True
    if cancelled:  # what the caller hears of is its cancellation, whether or not the work failed meanwhile
        task.exception()
        raise asyncio.CancelledError
    task.result()


class TrialHost(Protocol):
    async def load(self, name: str, config: mc.ModelConfig, entry: ModelEntry, version: int) -> None:
        """Load ``config`` (named ``name``) with the model file of ``entry``'s ``version``; return once ready."""

    async def infer(self, name: str, version: int, inputs: list[InferInput]) -> None:
        """Run one request on the trial; raises ``GatewayError`` when it fails."""

    async def unload(self, name: str) -> None:
        """Unload the trial (for an in-place trial: put the serving config back). Raises ``GatewayError`` only when an
        in-place trial's serving config could not be put back (production serves the trial's config): the run must
        end saying so; a trial beside the model that fails to unload is logged."""

    async def close(self) -> None:
        """Unload whatever is still loaded and release the host's resources."""

    def server_pids(self) -> list[int]:
        """The processes whose CPU time is the server's: this one, and Triton's when it runs on this host."""


class EmbeddedTrials:
    """Trials in this process, each with its own batcher and thread pool, as the serving versions have."""

    def __init__(self, settings: Settings) -> None:
        self._root = Path(tempfile.mkdtemp(prefix="switchyard-tune-"))
        self._catalog = Catalog(self._root)
        # No metrics: a trial's private name must never become a label.
        self._backend = embedded_backend(self._catalog, settings, metrics=None, inline_batches=False)
        self._loaded: dict[str, int] = {}

    async def load(self, name: str, config: mc.ModelConfig, entry: ModelEntry, version: int) -> None:
        await asyncio.to_thread(_stage, self._root, name, config, entry, version)
        await asyncio.to_thread(self._catalog.scan)
        self._loaded[name] = version
        await self._backend.load(name, version)

    async def infer(self, name: str, version: int, inputs: list[InferInput]) -> None:
        request = InferRequest(model=name, version=version, inputs=inputs)
        await self._backend.infer(request, version=version, timeout_s=None, priority=0)

    async def unload(self, name: str) -> None:
        version = self._loaded.pop(name, None)
        if version is not None and self._backend.state(name, version) is not None:
            with contextlib.suppress(GatewayError):
                await self._backend.unload(name, version)
        await asyncio.to_thread(shutil.rmtree, self._root / name, True)

    async def close(self) -> None:
        for name in list(self._loaded):
            await self.unload(name)
        await self._backend.close()
        await asyncio.to_thread(shutil.rmtree, self._root, True)

    def server_pids(self) -> list[int]:
        return [os.getpid()]


def _stage(root: Path, name: str, config: mc.ModelConfig, entry: ModelEntry, version: int) -> None:
    """The trial as a one-model repository: its config, and the version folder's model file linked in."""
    model_dir = root / name
    shutil.rmtree(model_dir, ignore_errors=True)
    (model_dir / str(version)).mkdir(parents=True)
    (model_dir / layout.CONFIG_FILE).write_text(to_text(config))
    filename = layout.model_filename(entry.config)
    if filename is None:
        raise GatewayError(f"model '{entry.name}' has no model file the embedded backend could run", 422)
    source = entry.version_dir(version) / filename
    target = model_dir / str(version) / filename
    if source.is_dir():  # an ONNX model with external data
        shutil.copytree(source, target, copy_function=_link)
    else:
        _link(str(source), str(target))


def _link(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another filesystem
        shutil.copy2(source, target)
