"""A client that shrinks its shared-memory object after registering regions of it (issue #28, finding 1), against
the Triton backend in a gateway process of its own: with the gateway copying tensors between the regions and its
requests to Triton, and with the regions registered in Triton too (``triton_shared_memory``), where Triton would read
and write the shrunk object through its own mapping. Each request is refused with a 400 / INVALID_ARGUMENT naming the
region, over HTTP and gRPC; the gateway and Triton live on and serve."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.tritonlocal import LocalTriton
from tests.gateway_process import GatewayProcess, gateway_process
from tests.shm_attacks import (
    REFUSED,
    assert_refused_naming_regions,
    served_plainly,
    shrink_then_infer,
    shrink_while_inferring,
)

pytestmark = pytest.mark.slow  # a local Triton

TOKEN = "hostile-shared-memory-triton-token"


@pytest.fixture(scope="module", params=["copied", "forwarded"])
def gateway(
    request: pytest.FixtureRequest, triton: LocalTriton, repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    forwarded = "true" if request.param == "forwarded" else "false"
    options = ("--backend", "triton", "--triton-local-cpu", "--triton-url", triton.grpc_url)
    work = tmp_path_factory.mktemp(f"shm-{request.param}")
    with gateway_process(
        repository, work, token=TOKEN, options=options, shared_memory="true", triton_shared_memory=forwarded
    ) as running:
        yield running


def alive(gateway: GatewayProcess, triton: LocalTriton) -> bool:
    gateway_alive = gateway.process is not None and gateway.process.poll() is None
    return gateway_alive and triton.pid is not None and Path(f"/proc/{triton.pid}").exists()


def test_shrunk_region_answers_400_naming_it_when_requests_read_or_write_it(
    gateway: GatewayProcess, triton: LocalTriton
) -> None:
    assert_refused_naming_regions(shrink_then_infer(gateway.http_url, gateway.grpc_url))
    assert alive(gateway, triton)
    assert served_plainly(gateway.http_url)


# Copied only: with the regions registered in Triton, Triton reads and writes the object itself after the gateway
# checked its size, and a client shrinking it in that moment reaches Triton's mapping
# (services/gateway/backends/triton/shared_memory.py).
@pytest.mark.parametrize("gateway", ["copied"], indirect=True)
def test_gateway_survives_when_object_shrinks_and_grows_while_requests_use_it(
    gateway: GatewayProcess, triton: LocalTriton
) -> None:
    outcomes = shrink_while_inferring(gateway.http_url, gateway.grpc_url, rounds=20)
    assert alive(gateway, triton)
    unexpected = [o for o in outcomes if o.status != "200" and not (o.status in REFUSED and "shrunk" in o.message)]
    assert unexpected == [], unexpected
    assert served_plainly(gateway.http_url)
