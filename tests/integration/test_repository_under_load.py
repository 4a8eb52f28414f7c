"""A load_model through the repository API (gRPC aio, with and without a config override) while 32 clients send
unversioned requests to the embedded backend, the gateway in its own process: no request fails, none misrouted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway_process import GatewayProcess, gateway_on_copy
from tests.repository_load import loads_under_load

TOKEN = "repository-load-token"


@pytest.fixture
def gateway(repository: Path, tmp_path: Path) -> Iterator[GatewayProcess]:
    with gateway_on_copy(repository, tmp_path, token=TOKEN) as running:
        yield running


@pytest.mark.slow
async def test_repository_loads_fail_no_request_and_misroute_none_when_32_clients_send(
    gateway: GatewayProcess,
) -> None:
    run = await loads_under_load(gateway.http_url, gateway.grpc_url, TOKEN, initial=2)
    print(f"\nembedded backend: {len(run.answers)} requests, {run.during_loads()} during the loads, "
          f"{len(run.failures())} failed; loads took {[round(e - s, 2) for s, e, _ in run.loads]} s")
    assert run.failures() == []
    assert run.misrouted() == []
    assert {a.version for a in run.answers} == {1, 2}
    assert run.during_loads() > 50
