"""A client that shrinks its shared-memory object after registering regions of it (issue #28, finding 1), against
the embedded backend in a gateway process of its own (a SIGBUS there must not take pytest down with it): each request
is refused with a 400 / INVALID_ARGUMENT naming the region, over HTTP and gRPC, and the gateway lives on and serves."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway_process import GatewayProcess, gateway_process
from tests.shm_attacks import (
    REFUSED,
    assert_refused_naming_regions,
    served_plainly,
    shrink_then_infer,
    shrink_while_inferring,
)

pytestmark = pytest.mark.slow
TOKEN = "hostile-shared-memory-token"


@pytest.fixture(scope="module")
def gateway(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with gateway_process(repository, tmp_path_factory.mktemp("shm"), token=TOKEN, shared_memory="true") as running:
        yield running


def alive(gateway: GatewayProcess) -> bool:
    return gateway.process is not None and gateway.process.poll() is None


def test_shrunk_region_answers_400_naming_it_when_requests_read_or_write_it(gateway: GatewayProcess) -> None:
    assert_refused_naming_regions(shrink_then_infer(gateway.http_url, gateway.grpc_url))
    assert alive(gateway)
    assert served_plainly(gateway.http_url)


def test_gateway_survives_when_object_shrinks_and_grows_while_requests_use_it(gateway: GatewayProcess) -> None:
    outcomes = shrink_while_inferring(gateway.http_url, gateway.grpc_url, rounds=50)
    assert alive(gateway)
    unexpected = [o for o in outcomes if o.status != "200" and not (o.status in REFUSED and "shrunk" in o.message)]
    assert unexpected == [], unexpected
    assert served_plainly(gateway.http_url)
    assert "Traceback" not in gateway.log.read_text()
