"""The model-repository extension on the embedded backend, through tritonclient's four flavours against a gateway on
real ports: index, unload, load (with and without a config override), auth, refusals that change nothing, a new model
folder loaded on request, and the audit log."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from examples import models
from services.gateway.settings import Settings
from tests.gateway_harness import RunningGateway, running_gateway
from tests.repository_clients import (
    FLAVOURS,
    HOSTILE_CONFIGS,
    RepositoryClient,
    assert_override_refused,
    open_client,
    policy,
    states,
    status,
)
from tests.repository_scenarios import all_ready, narrow_then_widen, unload_then_load_back

pytestmark = pytest.mark.slow  # a gateway on real ports

TOKEN = "repository-api-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
MLP = {"features": models.mlp_inputs(1, seed=3).numpy()}


@pytest.fixture(scope="module")
def source(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """classifier and mlp (versions 1 and 2, policy ``all``) in a repository these tests may add folders to."""
    root = tmp_path_factory.mktemp("repository-api") / "repository"
    for model in ("classifier", "mlp"):
        shutil.copytree(repository / model, root / model)
    return root


@pytest.fixture(scope="module")
def gateway(source: Path) -> Iterator[RunningGateway]:
    settings = Settings(repository=source, port=0, grpc_port=0, admin_token=TOKEN,  # type: ignore[arg-type]
                        repository_poll_s=0)
    with running_gateway(settings) as running:
        yield running


@pytest.fixture(params=FLAVOURS)
async def client(request: pytest.FixtureRequest, gateway: RunningGateway) -> AsyncIterator[RepositoryClient]:
    opened = open_client(request.param, gateway.http_url, gateway.grpc_url, TOKEN)
    yield opened
    await opened.close()


def _post(gateway: RunningGateway, path: str, body: Any = None, token: str | None = TOKEN) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return httpx.post(f"http://{gateway.http_url}{path}", json=body, headers=headers, timeout=60)


def _generation(gateway: RunningGateway, model: str) -> int:
    status = httpx.get(f"http://{gateway.http_url}/admin/models/{model}", headers=ADMIN, timeout=10).json()
    return int(status["routing"]["generation"])


async def test_repository_index_lists_every_model_version_ready_when_all_are_loaded(client: RepositoryClient) -> None:
    index = await client.index()
    assert states(index, "classifier") == all_ready((1, 2))
    assert states(index, "mlp") == all_ready((1, 2))


async def test_repository_unload_then_load_serves_again_when_called_through_each_client(
    client: RepositoryClient,
) -> None:
    await unload_then_load_back(client, "mlp", MLP, (1, 2))


async def test_repository_load_serves_only_the_override_versions_when_its_policy_is_specific(
    client: RepositoryClient,
) -> None:
    await narrow_then_widen(client, "mlp", MLP)


def test_repository_index_lists_ready_versions_only_when_ready_is_asked(gateway: RunningGateway) -> None:
    narrowed = _post(gateway, "/v2/repository/models/mlp/load", {"parameters": {"config": json.dumps(policy(2))}})
    assert narrowed.is_success
    try:
        ready = _post(gateway, "/v2/repository/index", {"ready": True}).json()
        assert {(e["name"], e["version"]) for e in ready} == {("classifier", "1"), ("classifier", "2"), ("mlp", "2")}
        with grpc.insecure_channel(gateway.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            answer = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True),
                                          metadata=(("authorization", f"Bearer {TOKEN}"),))
        assert {(m.name, m.version, m.state) for m in answer.models} == {(n, v, "READY") for n, v in
                                                                        {(e["name"], e["version"]) for e in ready}}
        full = _post(gateway, "/v2/repository/index").json()
        assert {"name": "mlp", "version": "1", "state": "UNAVAILABLE", "reason": "not loaded"} in full
    finally:
        assert _post(gateway, "/v2/repository/models/mlp/load").is_success


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_repository_api_refuses_401_or_403_when_the_token_is_missing_or_wrong(
    gateway: RunningGateway, flavour: str
) -> None:
    expected = {None: ("401", "UNAUTHENTICATED"), "wrong-token": ("403", "PERMISSION_DENIED")}
    for token, codes in expected.items():
        anonymous = open_client(flavour, gateway.http_url, gateway.grpc_url, token)
        try:
            for call in (anonymous.index(), anonymous.load("mlp"), anonymous.unload("mlp")):
                with pytest.raises(InferenceServerException) as refused:
                    await call
                assert status(refused.value) in codes
        finally:
            await anonymous.close()
    missing = _post(gateway, "/v2/repository/index", token=None)
    assert missing.headers["www-authenticate"].startswith("Bearer")
    assert "Authorization: Bearer" in missing.json()["error"]
    assert _post(gateway, "/v2/repository/index", token="wrong").json() == {"error": "the admin token is not valid"}


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ("{not json", "not a ModelConfig in JSON"),
        (json.dumps({"version_policy": {"newest": {}}}), "newest"),
        (json.dumps({"dynamic_batching": {"max_queue_delay_microseconds": 7}}), "dynamic_batching"),
        (json.dumps({"input": [{"name": "features", "data_type": "TYPE_FP32", "dims": [16]}]}), "input 'features'"),
        (json.dumps({"input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [32]}]}), "['features']"),
        (json.dumps({"name": "classifier"}), "names model 'classifier'"),
        (json.dumps({"backend": "tensorrt"}), "a load cannot change a model's platform or backend"),
        (json.dumps(policy(7)), "selects no version"),
    ],
)
def test_repository_load_answers_400_naming_the_problem_when_the_config_override_is_bad(
    gateway: RunningGateway, config: str, named: str
) -> None:
    before, generation = _post(gateway, "/v2/repository/index").json(), _generation(gateway, "mlp")
    answer = _post(gateway, "/v2/repository/models/mlp/load", {"parameters": {"config": config}})
    assert answer.status_code == 400
    assert named in answer.json()["error"]
    assert _post(gateway, "/v2/repository/index").json() == before
    assert _generation(gateway, "mlp") == generation


def test_repository_load_refuses_file_overrides_and_unknown_parameters_when_sent_over_both_protocols(
    gateway: RunningGateway,
) -> None:
    for parameters, named in [({"file:1/model.onnx": "AAAA"}, "file overrides"), ({"config": 3}, "must be a string"),
                              ({"reload": True}, "unknown load parameter 'reload'")]:
        answer = _post(gateway, "/v2/repository/models/mlp/load", {"parameters": parameters})
        assert (answer.status_code, named in answer.json()["error"]) == (400, True)
    with grpcclient.InferenceServerClient(gateway.grpc_url) as grpc_client, pytest.raises(
        InferenceServerException
    ) as refused:
        grpc_client.load_model("mlp", headers={"authorization": f"Bearer {TOKEN}"}, config=json.dumps(policy(2)),
                               files={"file:2/model.onnx": b"\0"})
    assert status(refused.value) == "INVALID_ARGUMENT"
    assert "file overrides" in str(refused.value.message())
    assert _post(gateway, "/v2/repository/models/mlp/unload", {"parameters": {"unload_dependents": "yes"}}
                 ).status_code == 400


@pytest.mark.parametrize("config", HOSTILE_CONFIGS.values(), ids=HOSTILE_CONFIGS.keys())
def test_repository_load_answers_400_when_the_config_override_is_nested_or_huge_over_both_protocols(
    gateway: RunningGateway, config: str
) -> None:
    """The probe's config overrides (issue #28): a RecursionError or Python's integer-string limit were a 500."""
    generation = _generation(gateway, "mlp")
    assert_override_refused(gateway.http_url, gateway.grpc_url, TOKEN, config)
    assert _generation(gateway, "mlp") == generation


async def test_repository_load_answers_not_found_and_unload_does_nothing_when_the_model_is_unknown(
    client: RepositoryClient,
) -> None:
    with pytest.raises(InferenceServerException) as refused:
        await client.load("no_such_model")
    assert status(refused.value) in ("404", "NOT_FOUND")
    assert str(refused.value.message()).startswith(
        "failed to load 'no_such_model', failed to poll from model repository"
    )
    await client.unload("no_such_model")  # as in Triton: nothing to unload is not an error


async def test_repository_load_reads_in_and_serves_a_model_when_its_folder_is_new(
    gateway: RunningGateway, source: Path
) -> None:
    shutil.copytree(source / "mlp", source / "mlp_new")
    config = source / "mlp_new" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "mlp"', 'name: "mlp_new"'))
    client = open_client("grpc_aio", gateway.http_url, gateway.grpc_url, TOKEN)
    try:
        assert "mlp_new" not in {e["name"] for e in await client.index()}
        await client.load("mlp_new")
        assert states(await client.index(), "mlp_new") == all_ready((1, 2))
        assert await client.infer("mlp_new", MLP) == 2
    finally:
        await client.close()


def test_repository_calls_are_in_the_audit_log_when_they_ran(gateway: RunningGateway) -> None:
    assert _post(gateway, "/v2/repository/models/classifier/load", {"parameters": {"config": json.dumps(policy(2))}}
                 ).is_success
    assert _post(gateway, "/v2/repository/models/classifier/load").is_success
    events = httpx.get(f"http://{gateway.http_url}/admin/models/classifier/events", headers=ADMIN, timeout=10)
    narrowed, widened = events.json()["events"][-2:]
    assert (narrowed["action"], narrowed["result"], widened["result"]) == ("repository_load", "ok", "ok")
    assert narrowed["actor"].startswith("repository-api (token:")
    assert TOKEN not in json.dumps(events.json())
    assert narrowed["detail"] == {"policy": "specific [2]", "loaded": [2], "unloaded": [1], "config_override": True}
    assert widened["detail"]["loaded"] == [1, 2]


def test_server_metadata_names_the_model_repository_extension_when_asked(gateway: RunningGateway) -> None:
    assert "model_repository" in httpx.get(f"http://{gateway.http_url}/v2", timeout=10).json()["extensions"]
    with grpcclient.InferenceServerClient(gateway.grpc_url) as grpc_client:
        assert "model_repository" in grpc_client.get_server_metadata().extensions


def test_repository_api_serves_without_a_token_when_the_open_setting_is_on(source: Path) -> None:
    settings = Settings(repository=source, port=0, grpc_port=0, repository_api_open=True, repository_poll_s=0)
    with running_gateway(settings) as running, grpcclient.InferenceServerClient(running.grpc_url) as grpc_client:
        assert _post(running, "/v2/repository/index", token=None).status_code == 200
        grpc_client.load_model("mlp", config=json.dumps(policy(1)))
        assert {m.version for m in grpc_client.get_model_repository_index().models if m.state == "READY"
                and m.name == "mlp"} == {"1"}
        assert httpx.get(f"http://{running.http_url}/admin/models", timeout=10).status_code == 403  # admin stays off


def test_repository_api_answers_403_saying_what_to_set_when_no_token_is_configured(source: Path) -> None:
    settings = Settings(repository=source, port=0, grpc_port=0, repository_poll_s=0)
    with running_gateway(settings) as running, grpcclient.InferenceServerClient(running.grpc_url) as grpc_client:
        answer = _post(running, "/v2/repository/index", token="anything")
        message = ("the repository API needs SWITCHYARD_ADMIN_TOKEN or SWITCHYARD_REPOSITORY_API_OPEN=true (or an "
                   "operator token in the API keys file)")
        assert (answer.status_code, answer.json()) == (403, {"error": message})
        with pytest.raises(InferenceServerException) as refused:
            grpc_client.unload_model("mlp")
        assert (status(refused.value), refused.value.message()) == ("PERMISSION_DENIED", message)
