"""Hot version switching on the embedded backend: zero failed requests and no misrouted answer while 32 clients
send unversioned requests through six switches (two of which load a version), the gateway in its own process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway_process import GatewayProcess, gateway_on_copy
from tests.swap_load import PLAN, TOKEN, switch_under_load


@pytest.fixture
def gateway(repository: Path, tmp_path: Path) -> Iterator[GatewayProcess]:
    with gateway_on_copy(repository, tmp_path, token=TOKEN) as running:
        yield running


@pytest.mark.slow
async def test_switches_under_load_fail_no_request_and_misroute_none_when_32_clients_send(
    gateway: GatewayProcess,
) -> None:
    run = await switch_under_load(gateway.http_url)
    print("\n" + run.summary("embedded backend, classifier"))
    assert len(run.flips) == len(PLAN) >= 5
    assert run.failures() == []
    assert run.misrouted() == []
    assert {a.version for a in run.answers} == {1, 2}
    assert sum(run.swaps_started <= a.sent <= run.swaps_ended for a in run.answers) > 100  # load during the swaps
