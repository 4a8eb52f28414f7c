"""The model-repository extension in front of the real local Triton: the same index / unload / load scenarios as on
the embedded backend, Triton following every step, and a load_model during 32-client load that fails no request."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from examples import models
from services.tritonlocal import LocalTriton, TritonInstall
from tests.gateway_process import GatewayProcess, gateway_process
from tests.repository_clients import HOSTILE_CONFIGS, assert_override_refused, open_client, states
from tests.repository_load import loads_under_load
from tests.repository_scenarios import all_ready, narrow_then_widen, unload_then_load_back
from tests.triton.support import local_triton

pytestmark = pytest.mark.slow  # a local Triton

TOKEN = "repository-api-token"
MLP = {"features": models.mlp_inputs(1, seed=8).numpy()}


@pytest.fixture(scope="module")
def servers(
    install: TritonInstall, repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LocalTriton, GatewayProcess]]:
    """A Triton of its own (these tests unload models from it) and the gateway in its own process in front of it."""
    work = tmp_path_factory.mktemp("repository-api-triton")
    source = work / "repository"
    for model in ("classifier", "mlp"):
        shutil.copytree(repository / model, source / model)
    with local_triton(source, work, install) as triton:
        options = ("--backend", "triton", "--triton-local-cpu", "--triton-url", triton.grpc_url)
        with gateway_process(source, work, token=TOKEN, options=options) as gateway:
            yield triton, gateway


async def test_repository_unload_then_load_reaches_triton_when_called_over_grpc(
    servers: tuple[LocalTriton, GatewayProcess],
) -> None:
    triton, gateway = servers
    client = open_client("grpc_aio", gateway.http_url, gateway.grpc_url, TOKEN)
    try:
        assert states(await client.index(), "classifier") == all_ready((1, 2))
        await client.unload("mlp")
        assert triton.model_states("mlp") == {1: "UNAVAILABLE", 2: "UNAVAILABLE"}
        await client.load("mlp")
        await unload_then_load_back(client, "mlp", MLP, (1, 2))
        assert triton.model_states("mlp") == {1: "READY", 2: "READY"}
    finally:
        await client.close()


async def test_repository_load_pins_triton_to_the_override_versions_when_called_over_http(
    servers: tuple[LocalTriton, GatewayProcess],
) -> None:
    triton, gateway = servers
    client = open_client("http_aio", gateway.http_url, gateway.grpc_url, TOKEN)
    try:
        await narrow_then_widen(client, "mlp", MLP)
        assert triton.model_states("mlp") == {1: "READY", 2: "READY"}
    finally:
        await client.close()


async def test_repository_loads_fail_no_request_when_32_clients_send(
    servers: tuple[LocalTriton, GatewayProcess],
) -> None:
    triton, gateway = servers
    run = await loads_under_load(gateway.http_url, gateway.grpc_url, TOKEN, initial=2)
    print(f"\nTriton backend: {len(run.answers)} requests, {run.during_loads()} during the loads, "
          f"{len(run.failures())} failed; loads took {[round(e - s, 2) for s, e, _ in run.loads]} s")
    assert run.failures() == []
    assert run.misrouted() == []
    assert {a.version for a in run.answers} == {1, 2}
    assert run.during_loads() > 50
    assert triton.model_states("classifier") == {1: "READY", 2: "READY"}


@pytest.mark.parametrize("config", HOSTILE_CONFIGS.values(), ids=HOSTILE_CONFIGS.keys())
def test_repository_load_answers_400_when_the_config_override_is_nested_or_huge_over_both_protocols(
    servers: tuple[LocalTriton, GatewayProcess], config: str
) -> None:
    """The probe's config overrides (issue #28) were a 500 / INTERNAL; Triton is never asked."""
    triton, gateway = servers
    assert_override_refused(gateway.http_url, gateway.grpc_url, TOKEN, config)
    assert triton.model_states("mlp") == {1: "READY", 2: "READY"}
    assert gateway.process is not None
    assert gateway.process.poll() is None
