"""A client that shrinks its shared memory under the gateway (issue #28, finding 1): regions of a 4 KiB shm object
are registered, then the object is truncated, once for good or again and again while requests read and write the
regions, over HTTP and gRPC. A gateway that touched a mapping of the object past its new end died of SIGBUS.

Once the object is truncated, the test process must not touch its own mapping of it either (the client handle's):
contents are written through a descriptor."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.shm_support import ShmObject, shm_object

ROWS = 2
FEATURES = ROWS * 32 * 4
"""The mlp's input, at offset 0 of the object (region "in")."""
SCORES = ROWS * 8 * 4
"""One of its outputs, right after the input (region "out")."""
OBJECT_BYTES = 4096
REFUSED = ("400", "StatusCode.INVALID_ARGUMENT")


@dataclass(frozen=True)
class Outcome:
    request: str
    """``http input`` (read from a region), ``grpc output`` (written into one), ..."""
    status: str
    """``200`` when answered, else the error's status as tritonclient gives it (``400``, ``StatusCode....``)."""
    message: str


@contextmanager
def registered_object(http_url: str) -> Iterator[ShmObject]:
    """A 4 KiB shm object holding mlp features at 0, registered as regions "in" and "out"; unregistered on exit."""
    with shm_object(OBJECT_BYTES) as region:
        region.put(np.random.default_rng(28).standard_normal((ROWS, 32), dtype=np.float32))
        with httpclient.InferenceServerClient(http_url) as client:
            client.register_system_shared_memory("in", region.key, FEATURES)
            client.register_system_shared_memory("out", region.key, SCORES, offset=FEATURES)
            try:
                yield region
            finally:
                client.unregister_system_shared_memory()


def shrink_then_infer(http_url: str, grpc_url: str) -> list[Outcome]:
    """Truncate the object to 0 after registering, then one request per protocol reading "in" and one writing
    "out" (its input in the request)."""
    with registered_object(http_url) as region:
        os.truncate(region.path, 0)
        return infer_each_way(http_url, grpc_url)


def infer_each_way(http_url: str, grpc_url: str) -> list[Outcome]:
    outcomes = []
    with httpclient.InferenceServerClient(http_url) as http, grpcclient.InferenceServerClient(grpc_url) as grpc:
        ways: list[tuple[str, ModuleType, Any]] = [("http", httpclient, http), ("grpc", grpcclient, grpc)]
        for protocol, module, client in ways:
            outcomes.append(_outcome(f"{protocol} input", partial(_from_region, module, client)))
            outcomes.append(_outcome(f"{protocol} output", partial(_into_region, module, client)))
    return outcomes


def assert_refused_naming_regions(outcomes: list[Outcome]) -> None:
    """Each request of ``shrink_then_infer`` was refused with a 400 naming its region and the object's size now."""
    assert [(o.request, o.status in REFUSED) for o in outcomes] == [
        ("http input", True), ("http output", True), ("grpc input", True), ("grpc output", True)
    ], outcomes
    for outcome in outcomes:
        region = "'in'" if outcome.request.endswith("input") else "'out'"
        assert f"shared memory region {region}" in outcome.message, outcome
        assert "has 0 bytes now" in outcome.message, outcome


def shrink_while_inferring(http_url: str, grpc_url: str, rounds: int) -> list[Outcome]:
    """``rounds`` of `infer_each_way` while another thread truncates the object to 0 and grows it back without
    pause: the object may shrink between any check and any copy."""
    with registered_object(http_url) as region:
        stop = threading.Event()

        def shrink_and_grow() -> None:
            while not stop.is_set():
                os.truncate(region.path, 0)
                os.truncate(region.path, OBJECT_BYTES)

        racer = threading.Thread(target=shrink_and_grow)
        racer.start()
        try:
            return [outcome for _ in range(rounds) for outcome in infer_each_way(http_url, grpc_url)]
        finally:
            stop.set()
            racer.join()


def served_plainly(http_url: str) -> bool:
    """One request with its tensor in the body answers: the gateway (and its model server) still serve."""
    with httpclient.InferenceServerClient(http_url) as client:
        tensor = httpclient.InferInput("features", [ROWS, 32], "FP32")
        tensor.set_data_from_numpy(np.ones((ROWS, 32), dtype=np.float32))
        result = client.infer("mlp", [tensor])
    probabilities = result.as_numpy("probabilities")
    return probabilities is not None and bool(np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-4))


def _from_region(module: ModuleType, client: Any) -> None:
    tensor = module.InferInput("features", [ROWS, 32], "FP32")
    tensor.set_shared_memory("in", FEATURES)
    client.infer("mlp", [tensor])


def _into_region(module: ModuleType, client: Any) -> None:
    tensor = module.InferInput("features", [ROWS, 32], "FP32")
    tensor.set_data_from_numpy(np.zeros((ROWS, 32), dtype=np.float32))
    output = module.InferRequestedOutput("probabilities")
    output.set_shared_memory("out", SCORES)
    client.infer("mlp", [tensor], outputs=[output])


def _outcome(request: str, call: Callable[[], None]) -> Outcome:
    try:
        call()
    except InferenceServerException as exc:
        return Outcome(request, str(exc.status()), exc.message())
    return Outcome(request, "200", "")
