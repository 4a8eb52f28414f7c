"""Per-key model access through the app (scripted backend, in-process gRPC): a key limited to some models gets 403 /
PERMISSION_DENIED on the others, counted with reason ``forbidden`` against its tenant, and its repository index,
metadata and statistics show only its models."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from pathlib import Path

import grpc
import pytest
from app_clients import Clients, both_protocols
from prometheus_client import CollectorRegistry
from scripted_backend import ScriptedBackend
from tritonclient.grpc import service_pb2

from services.gateway.settings import Settings
from services.keyfile.format import KeyEntry, hash_secret, presented_key
from services.keyfile.writing import write_entries

BODY = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
ADMIN = {"authorization": "Bearer s3cret-admin-token"}
DOUBLE_ONLY = presented_key("doubles", "secret-of-doubles")
MLP_ONLY = presented_key("mlps", "secret-of-mlps")


def keys_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys.toml"
    entries = {
        "doubles": KeyEntry("doubles", (hash_secret("secret-of-doubles"),), ("doub*",), None, "doubles"),
        "mlps": KeyEntry("mlps", (hash_secret("secret-of-mlps"),), ("mlp",), None, "mlps"),
    }
    write_entries(path, entries)
    return path


def gateway(
    backend: ScriptedBackend, registry: CollectorRegistry, settings: Settings, tmp_path: Path
) -> AbstractAsyncContextManager[Clients]:
    return both_protocols(backend, settings, registry, api_keys_file=keys_file(tmp_path), protect_metadata=True)


def count(registry: CollectorRegistry, name: str, labels: dict[str, str]) -> float:
    return registry.get_sample_value(name, labels) or 0.0


@pytest.mark.slow
async def test_key_limited_to_some_models_is_refused_and_shown_only_its_models(
    backend: ScriptedBackend, registry: CollectorRegistry, settings: Settings, tmp_path: Path
) -> None:
    async with gateway(backend, registry, settings, tmp_path) as (http, stub):
        allowed = await http.post("/v2/models/double/infer", json=BODY, headers={"x-api-key": DOUBLE_ONLY})
        refused = await http.post("/v2/models/double/infer", json=BODY, headers={"x-api-key": MLP_ONLY})
        request = service_pb2.ModelInferRequest(model_name="classifier")
        with pytest.raises(grpc.aio.AioRpcError) as grpc_refused:
            await stub.ModelInfer(request, metadata=(("x-api-key", DOUBLE_ONLY),))
        metadata = await http.get("/v2/models/double", headers={"x-api-key": MLP_ONLY})
        stats = await http.get("/v2/models/stats", headers={"x-api-key": MLP_ONLY})
        own_stats = await http.get("/v2/models/stats", headers={"x-api-key": DOUBLE_ONLY})
        index = {
            key: await http.post("/v2/repository/index", json={}, headers={**ADMIN, "x-api-key": key})
            for key in (DOUBLE_ONLY, MLP_ONLY)
        }
        grpc_index = await stub.RepositoryIndex(
            service_pb2.RepositoryIndexRequest(), metadata=(*ADMIN.items(), ("x-api-key", MLP_ONLY))
        )
        admin_index = await http.post("/v2/repository/index", json={}, headers=ADMIN)  # no key: the whole index

    assert allowed.status_code == 200, allowed.text
    assert refused.status_code == 403
    assert refused.json() == {"error": "this API key may not use model 'double'"}
    assert grpc_refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert grpc_refused.value.details() == "this API key may not use model 'classifier'"
    assert metadata.status_code == 403
    assert count(registry, "switchyard_rejected_total", {"model": "double", "reason": "forbidden"}) == 1
    assert count(registry, "switchyard_rejected_total", {"model": "_other", "reason": "forbidden"}) == 1
    assert count(registry, "switchyard_tenant_requests_total", {"tenant": "mlps", "code": "403"}) == 1
    assert count(registry, "switchyard_tenant_requests_total", {"tenant": "doubles", "code": "403"}) == 1

    assert stats.json() == {"model_stats": [], "gateway_stats": []}
    assert {entry["name"] for entry in own_stats.json()["model_stats"]} == {"double"}
    assert {entry["name"] for entry in index[DOUBLE_ONLY].json()} == {"double"}
    assert index[MLP_ONLY].json() == []
    assert list(grpc_index.models) == []
    assert {entry["name"] for entry in admin_index.json()} == {"double"}


@pytest.mark.slow
async def test_a_stream_checks_its_key_for_each_request_and_goes_on_after_a_refusal(
    backend: ScriptedBackend, registry: CollectorRegistry, settings: Settings, tmp_path: Path
) -> None:
    """The stream's key (its call's metadata) is checked against each request's model: a refused request is
    answered with its id and the error, the stream's next request is served; a stream without a key gets each
    request refused the same way."""
    def request(model: str, request_id: str) -> service_pb2.ModelInferRequest:
        message = service_pb2.ModelInferRequest(model_name=model, id=request_id)
        message.inputs.add(name="x", datatype="FP32", shape=[1, 4])
        message.raw_input_contents.append(b"\0" * 16)
        return message

    async with gateway(backend, registry, settings, tmp_path) as (_, stub):
        stream = stub.ModelStreamInfer(metadata=(("x-api-key", DOUBLE_ONLY),))
        answers = []
        for model, request_id in (("double", "a"), ("mlp", "b"), ("double", "c")):
            await stream.write(request(model, request_id))
            answers.append(await stream.read())
        await stream.done_writing()
        keyless = stub.ModelStreamInfer()
        await keyless.write(request("double", "d"))
        refused = await keyless.read()
        await keyless.done_writing()

    assert [(a.infer_response.id, a.error_message) for a in answers] == [
        ("a", ""), ("b", "this API key may not use model 'mlp'"), ("c", "")
    ]
    assert (refused.infer_response.id, refused.error_message.startswith("missing API key")) == ("d", True)
    assert count(registry, "switchyard_tenant_requests_total", {"tenant": "doubles", "code": "403"}) == 1
