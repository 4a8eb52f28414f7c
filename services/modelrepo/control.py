"""Triton's model-repository API in explicit model-control mode: load versions with a complete config
override, unload, and wait until the repository index has settled. Used by the gateway's Triton backend
and by the local Triton launcher.

Sent over gRPC only: a load sent over HTTP can stall Triton's HTTP inference for the whole load.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection
from typing import Any

import grpc
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import InferenceServerException

from services.modelrepo.config import override_json

RepositoryIndex = dict[str, dict[int, str]]
"""model -> version -> Triton's state name (``READY``, ``LOADING``, ``UNLOADING``, ``UNAVAILABLE``)."""

SETTLE_POLL_S = 0.05
_MOVING = ("LOADING", "UNLOADING")


class ModelControlError(Exception):
    """A model-control call failed. ``code`` is the gRPC status name (``UNAVAILABLE``, ``NOT_FOUND``,
    ``INVALID_ARGUMENT``...) when Triton or gRPC answered, ``NOT_LOADED`` when Triton settled without the
    versions asked for, ``NOT_SETTLED`` when they were still moving at the deadline."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class ModelControl:
    """Model control over a ``tritonclient.grpc.aio.InferenceServerClient`` (owned by the caller)."""

    def __init__(self, client: Any, *, poll_s: float = SETTLE_POLL_S) -> None:
        self._client = client
        self._poll_s = poll_s

    async def index(self, timeout_s: float) -> RepositoryIndex:
        """Every model version Triton knows of, with its state (versions it never loaded are absent)."""
        answer = await self._call(
            "reading Triton's repository index",
            self._client.get_model_repository_index(as_json=True, client_timeout=timeout_s),
        )
        states: RepositoryIndex = {}
        for entry in answer.get("models", []):
            if entry.get("version"):
                states.setdefault(str(entry["name"]), {})[int(entry["version"])] = str(entry.get("state", ""))
        return states

    async def load(
        self,
        model: str,
        config: mc.ModelConfig,
        versions: Collection[int],
        *,
        timeout_s: float,
        observe: Callable[[RepositoryIndex], None] | None = None,
    ) -> None:
        """Make Triton serve exactly ``versions`` of ``model`` with ``config`` (sent whole, version policy
        pinned to ``versions``); return once they are READY and the versions it dropped have unloaded."""
        override = override_json(config, versions)
        await self._call(
            f"loading model '{model}' version(s) {sorted(versions)}",
            self._client.load_model(model, config=override, client_timeout=timeout_s),
        )
        await self.settle(model, set(versions), deadline=time.monotonic() + timeout_s, observe=observe)

    async def unload(
        self, model: str, *, timeout_s: float, observe: Callable[[RepositoryIndex], None] | None = None
    ) -> None:
        """Unload every version of ``model``; return once none is still unloading."""
        await self._call(f"unloading model '{model}'", self._client.unload_model(model, client_timeout=timeout_s))
        await self.settle(model, set(), deadline=time.monotonic() + timeout_s, observe=observe)

    async def settle(
        self,
        model: str,
        versions: set[int],
        *,
        deadline: float,
        observe: Callable[[RepositoryIndex], None] | None = None,
    ) -> None:
        """Poll the index until exactly ``versions`` are READY and nothing is loading or unloading (Triton
        answers an unload, and a load that drops versions, while versions are still UNLOADING)."""
        while True:
            index = await self.index(max(deadline - time.monotonic(), self._poll_s))
            if observe is not None:
                observe(index)
            states = index.get(model, {})
            moving = [v for v, state in states.items() if state in _MOVING]
            extra = [v for v, state in states.items() if state == "READY" and v not in versions]
            missing = sorted(v for v in versions if states.get(v) != "READY")
            if not moving and not extra and not missing:
                return
            if not moving and missing:
                raise ModelControlError(f"Triton did not load model '{model}' version(s) {missing}", "NOT_LOADED")
            if time.monotonic() > deadline:
                raise ModelControlError(_unsettled(model, states, moving, extra), "NOT_SETTLED")
            await asyncio.sleep(self._poll_s)

    @staticmethod
    async def _call(action: str, call: Any) -> Any:
        try:
            return await call
        except InferenceServerException as exc:
            code = str(exc.status() or "").removeprefix("StatusCode.") or "UNKNOWN"
            raise ModelControlError(f"{action} failed: {exc.message() or exc}", code) from None
        except grpc.RpcError as exc:
            code = exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else "UNAVAILABLE"
            raise ModelControlError(f"{action} failed: {exc}", code) from None
        except OSError as exc:
            raise ModelControlError(f"{action} failed: {exc}", "UNAVAILABLE") from None


def _unsettled(model: str, states: dict[int, str], moving: list[int], extra: list[int]) -> str:
    """Why ``model`` did not settle: what Triton reported last, and for versions it still serves that the last load
    dropped, the likely cause (Triton unloads them by itself within seconds)."""
    text = f"model '{model}' did not settle in Triton: {states}"
    if extra and not moving:
        text += (
            f"; version(s) {sorted(extra)} are still READY after the load that dropped them: another client of this "
            "Triton loads them back (a second gateway in front of it with a routing state of its own? gateways in "
            "front of one Triton share one state: SWITCHYARD_STATE_PATH or SWITCHYARD_REDIS_URL)"
        )
    return text
