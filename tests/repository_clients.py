"""The four ``tritonclient`` flavours (HTTP, HTTP aio, gRPC, gRPC aio) behind one async interface, for the tests of
the model-repository extension: index, load, unload and one unversioned inference, each raising tritonclient's own
``InferenceServerException`` as an ops script would see it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

FLAVOURS = ("http", "http_aio", "grpc", "grpc_aio")
Entry = dict[str, str]


class RepositoryClient(Protocol):
    async def index(self) -> list[Entry]: ...

    async def load(self, model: str, config: dict[str, Any] | None = None) -> None: ...

    async def unload(self, model: str) -> None: ...

    async def infer(self, model: str, inputs: dict[str, np.ndarray[Any, Any]]) -> int:
        """The version that served one unversioned request."""
        ...

    async def close(self) -> None: ...


def policy(*versions: int) -> dict[str, Any]:
    """A config override that only sets ``version_policy`` (``specific`` with ``versions``; ``all`` without)."""
    if not versions:
        return {"version_policy": {"all": {}}}
    return {"version_policy": {"specific": {"versions": list(versions)}}}


def status(error: InferenceServerException) -> str:
    """``404`` over HTTP, ``NOT_FOUND`` over gRPC."""
    return str(error.status() or "").removeprefix("StatusCode.")


def states(index: list[Entry], model: str) -> dict[str, tuple[str, str]]:
    """version -> (state, reason) of one model's entries."""
    return {e.get("version", ""): (e.get("state", ""), e.get("reason", "")) for e in index if e["name"] == model}


def open_client(flavour: str, http_url: str, grpc_url: str, token: str | None) -> RepositoryClient:
    headers = {"authorization": f"Bearer {token}"} if token is not None else None
    if flavour == "http":
        return _Http(httpclient.InferenceServerClient(http_url), headers, grpc=False)
    if flavour == "http_aio":
        return _Aio(httpaio.InferenceServerClient(http_url), headers, grpc=False)
    if flavour == "grpc":
        return _Http(grpcclient.InferenceServerClient(grpc_url), headers, grpc=True)
    return _Aio(grpcaio.InferenceServerClient(grpc_url), headers, grpc=True)


def _inputs(module: Any, inputs: dict[str, np.ndarray[Any, Any]]) -> list[Any]:
    built = []
    for name, array in inputs.items():
        tensor = module.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        built.append(tensor)
    return built


def _entries(answer: Any) -> list[Entry]:
    return list(answer["models"]) if isinstance(answer, dict) else list(answer)


class _Http:
    """A blocking client (HTTP or gRPC), called on the test's thread: tritonclient's HTTP client is gevent-based and
    must stay on the thread that made it, and the gateway serves from its own thread meanwhile."""

    def __init__(self, client: Any, headers: dict[str, str] | None, *, grpc: bool) -> None:
        self._client, self._headers, self._grpc = client, headers, grpc
        self._module: Any = grpcclient if grpc else httpclient

    async def _run(self, call: Callable[[], Any]) -> Any:
        return call()

    async def index(self) -> list[Entry]:
        extra = {"as_json": True} if self._grpc else {}
        return _entries(await self._run(lambda: self._client.get_model_repository_index(headers=self._headers,
                                                                                        **extra)))

    async def load(self, model: str, config: dict[str, Any] | None = None) -> None:
        text = json.dumps(config) if config is not None else None
        await self._run(lambda: self._client.load_model(model, headers=self._headers, config=text))

    async def unload(self, model: str) -> None:
        await self._run(lambda: self._client.unload_model(model, headers=self._headers, unload_dependents=True))

    async def infer(self, model: str, inputs: dict[str, np.ndarray[Any, Any]]) -> int:
        result = await self._run(lambda: self._client.infer(model, _inputs(self._module, inputs)))
        return int(result.get_response(as_json=True)["model_version"] if self._grpc
                   else result.get_response()["model_version"])

    async def close(self) -> None:
        self._client.close()


class _Aio(_Http):
    """An asyncio client (HTTP aio or gRPC aio)."""

    def __init__(self, client: Any, headers: dict[str, str] | None, *, grpc: bool) -> None:
        super().__init__(client, headers, grpc=grpc)
        self._module = grpcaio if grpc else httpaio

    async def _run(self, call: Callable[[], Any]) -> Any:
        return await call()

    async def close(self) -> None:
        await self._client.close()


HOSTILE_CONFIGS = {
    "3000-brackets": "[" * 3000 + "]" * 3000,
    "1000-levels-in-a-field": '{"max_batch_size": ' + "[" * 1000 + "]" * 1000 + "}",
    "5000-digits": '{"max_batch_size": ' + "9" * 5000 + "}",
    "5000-digits-in-policy": '{"version_policy": {"latest": {"num_versions": ' + "9" * 5000 + "}}}",
}
"""Config overrides that made the override parser recurse or convert without end (a 500 / INTERNAL before)."""


def assert_override_refused(http_url: str, grpc_url: str, token: str, config: str) -> None:
    """A load of ``mlp`` with ``config`` is a 400 / INVALID_ARGUMENT over HTTP and gRPC, naming the parameter."""
    with httpclient.InferenceServerClient(http_url) as http, grpcclient.InferenceServerClient(grpc_url) as grpc_client:
        for client in (http, grpc_client):
            with pytest.raises(InferenceServerException) as refused:
                client.load_model("mlp", headers={"authorization": f"Bearer {token}"}, config=config)
            assert status(refused.value) in ("400", "INVALID_ARGUMENT"), refused.value
            assert "the 'config' parameter is not a ModelConfig in JSON" in str(refused.value.message())
