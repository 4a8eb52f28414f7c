"""A decoupled python-backend model for the streaming tests: one request, many responses.

``countdown`` takes ``N`` (INT32 [1]) and sends N responses, the i-th with ``INDEX`` = i and ``COUNT`` = N, then
the final flag on its own (an empty final response: N = 0 gives only that). Two request parameters steer it:
``delay_ms`` sleeps that long before each response (at most ``MAX_DELAY_MS``: a test that streams across a version
switch needs the stream to last a moment, never long), and ``fail_at`` sends an error response in place of the
response of that index and ends the request there. A cancelled request (the caller went away) stops at its next
response with Triton's CANCELLED error, as a decoupled model should."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from tritonclient.grpc import InferenceServerClient
from tritonclient.utils import InferenceServerException

from services.gateway.dataplane import DataPlane
from services.gateway.tensors.types import NO_PARAMETERS, InferInput, InferRequest, InferResponse
from services.tritonlocal import LocalTriton
from tests.gateway_harness import RunningGateway
from tests.triton.support import gateway_settings, local_gateway

MODEL = "countdown"
MAX_DELAY_MS = 200
VERSIONS = (1, 2)

CONFIG = f"""
name: "{MODEL}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
version_policy {{ specific {{ versions: [1] }} }}
input {{ name: "N" data_type: TYPE_INT32 dims: [ 1 ] }}
output {{ name: "INDEX" data_type: TYPE_INT32 dims: [ 1 ] }}
output {{ name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] }}
instance_group {{ count: 1 kind: KIND_CPU }}
"""
"""Version 1 serves at startup; version 2 is on disk for a test to activate. One instance each: every python stub
costs a second to stop when the version unloads."""

MODEL_PY = f'''"""Sends N responses for input N, then the final flag (see tests/decoupled_models.py)."""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

MAX_DELAY_MS = {MAX_DELAY_MS}


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            self._answer(request)
        return None  # decoupled: every answer goes through the request's response sender

    def _answer(self, request):
        sender = request.get_response_sender()
        count = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy().reshape(-1)[0])
        parameters = json.loads(request.parameters() or "{{}}")
        delay_s = min(max(int(parameters.get("delay_ms", 0)), 0), MAX_DELAY_MS) / 1000
        fail_at = int(parameters.get("fail_at", -1))
        for index in range(count):
            if delay_s:
                time.sleep(delay_s)
            if request.is_cancelled():
                # The caller went away (the gateway cancels the call): stop, as a decoupled model should. Sending on
                # into a cancelled call crashed Triton 2.51 now and then (signal 11 in its gRPC front end, seen in CI).
                error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
                sender.send(pb_utils.InferenceResponse(error=error),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            if index == fail_at:
                error = pb_utils.TritonError(f"countdown failed at response {{index}} of {{count}}")
                sender.send(pb_utils.InferenceResponse(error=error))
                break
            outputs = [
                pb_utils.Tensor("INDEX", np.array([index], dtype=np.int32)),
                pb_utils.Tensor("COUNT", np.array([count], dtype=np.int32)),
            ]
            sender.send(pb_utils.InferenceResponse(output_tensors=outputs))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''


def write_countdown(repository: Path) -> Path:
    """The ``countdown`` model folder, versions 1 and 2 (the same code), in ``repository`` (created)."""
    folder = repository / MODEL
    for version in VERSIONS:
        (folder / str(version)).mkdir(parents=True, exist_ok=True)
        (folder / str(version) / "model.py").write_text(MODEL_PY)
    (folder / "config.pbtxt").write_text(CONFIG)
    return folder


def countdown_request(count: int, version: int | None = None, **parameters: int) -> InferRequest:
    """A request for ``count`` responses; ``parameters``: ``delay_ms``, ``fail_at``."""
    n = np.array([count], dtype=np.int32)
    return InferRequest(MODEL, version, [InferInput("N", "INT32", (1,), n)], id=f"countdown-{count}",
                        parameters=parameters or NO_PARAMETERS)


async def collect(dataplane: DataPlane, request: InferRequest) -> list[InferResponse]:
    """Every response of one streamed request (run it on the gateway's loop: ``RunningGateway.on_loop``)."""
    return [response async for response in dataplane.infer_stream(request, protocol="grpc")]


def counted(responses: list[InferResponse]) -> list[tuple[int, int, bool]]:
    """``(INDEX, COUNT, final)`` of each response; an empty final one reads ``(-1, -1, True)``."""
    found = []
    for response in responses:
        values = {output.name: int(output.data.reshape(-1)[0]) for output in response.outputs}
        found.append((values.get("INDEX", -1), values.get("COUNT", -1), response.final))
    return found


@contextmanager
def served_by(triton: LocalTriton, repository: Path) -> Iterator[None]:
    """``countdown`` (written in ``repository``) made loadable by a running local Triton that serves another
    repository (the session's): copied into the copy it serves, for as long as the body runs; unloaded and taken out
    again afterwards. A python model needs no derivation; the next rebuild of that copy would drop it, which none does
    while a test module runs."""
    target = triton.derived_root / MODEL
    shutil.copytree(repository / MODEL, target, dirs_exist_ok=True)
    try:
        yield
    finally:
        # Not waiting for the versions to settle (each python stub takes a second to stop): nothing loads this
        # model again, and its stubs hold what they read from the folder.
        with contextlib.suppress(InferenceServerException), InferenceServerClient(triton.grpc_url) as client:
            client.unload_model(MODEL)
        shutil.rmtree(target, ignore_errors=True)


@contextmanager
def countdown_gateway(triton: LocalTriton, work: Path, **settings: object) -> Iterator[RunningGateway]:
    """A gateway on the Triton backend, in front of ``triton``, serving a repository of ``countdown`` only (version 1
    loaded, version 2 on disk), with the model loaded in ``triton`` while it runs."""
    repository = work / "repository"
    write_countdown(repository)
    with served_by(triton, repository), local_gateway(gateway_settings(triton.grpc_url, repository, **settings)) as gw:
        yield gw
