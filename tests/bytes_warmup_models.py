"""BYTES models as other tools leave them, for the warm-up tests of both backends: Triton's ``simple_string`` and a
BYTES identity with neither manifest nor ``model_warmup`` (the gateway invents a warm-up, and empty strings are
no decimal number), and ``simple_string`` with a declared ``model_warmup``: ``decimals`` (a file of serialized
decimal strings, which it answers), ``absent`` (a file that is not there: Triton fails that load, and so does the
gateway) and ``empty_strings`` (``zero_data`` and ``random_data``, empty strings for BYTES in Triton, which it
cannot answer). Triton 2.51 crashes (signal 11) when its python backend answers a warm-up sample with an error,
so the Triton tests leave ``empty_strings`` out."""

from __future__ import annotations

import shutil
from pathlib import Path

import grpc
import httpx
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from tests.simple_models import ELEMENTS, as_strings, copy_simple_repository, simple_inputs
from tests.string_models import serialized, strings

FOREIGN = ("simple_string", "simple_identity")
DECIMALS = "simple_string_decimals"
EMPTY_STRINGS = "simple_string_empty"
ABSENT = "simple_string_absent"
DECIMALS_WARMUP = """
model_warmup {
  name: "decimals" batch_size: 2
  inputs { key: "INPUT0" value: { data_type: TYPE_STRING dims: [ 16 ] input_data_file: "decimals.bin" } }
  inputs { key: "INPUT1" value: { data_type: TYPE_STRING dims: [ 16 ] input_data_file: "decimals.bin" } }
}
"""
ABSENT_WARMUP = DECIMALS_WARMUP.replace('"decimals"', '"absent"').replace("decimals.bin", "absent.bin")
EMPTY_WARMUP = """
model_warmup {
  name: "empty_strings" batch_size: 1
  inputs { key: "INPUT0" value: { data_type: TYPE_STRING dims: [ 16 ] zero_data: true } }
  inputs { key: "INPUT1" value: { data_type: TYPE_STRING dims: [ 16 ] random_data: true } }
}
"""


def bytes_warmup_repository(simple: Path, target: Path, *, empty_strings: bool = True) -> Path:
    """``simple_string`` and ``simple_identity`` of the shared simple repository, and the declared variants
    (``empty_strings``: with the one whose warm-up is answered with an error)."""
    copy_simple_repository(simple, target, FOREIGN)
    _variant(target, DECIMALS, DECIMALS_WARMUP)
    (target / DECIMALS / "warmup").mkdir()
    (target / DECIMALS / "warmup" / "decimals.bin").write_bytes(serialized([str(i) for i in range(ELEMENTS)]))
    _variant(target, ABSENT, ABSENT_WARMUP)
    if empty_strings:
        _variant(target, EMPTY_STRINGS, EMPTY_WARMUP)
    return target


def _variant(root: Path, name: str, warmup: str) -> None:
    shutil.copytree(root / "simple_string", root / name)
    config = root / name / "config.pbtxt"
    text = config.read_text().replace('name: "simple_string"', f'name: "{name}"')
    assert f'name: "{name}"' in text, "simple_string's config no longer names itself as expected"
    config.write_text(text + warmup)


def expected_sums() -> tuple[list[bytes], list[bytes]]:
    """What ``simple_string`` answers for ``simple_inputs()`` (0..15 and ones): the sums and the differences."""
    return [str(i + 1).encode() for i in range(ELEMENTS)], [str(i - 1).encode() for i in range(ELEMENTS)]


def http_add_sub(url: str, model: str, *, binary: bool) -> tuple[list[bytes], list[bytes]]:
    """Triton's simple_http_string_infer_client's request: decimal strings as JSON or binary tensor data."""
    first, second = (as_strings(values) for values in simple_inputs())
    with httpclient.InferenceServerClient(url) as client:
        tensors = [httpclient.InferInput(name, [1, ELEMENTS], "BYTES") for name in ("INPUT0", "INPUT1")]
        for tensor, data in zip(tensors, (first, second), strict=True):
            tensor.set_data_from_numpy(data, binary_data=binary)
        outputs = [httpclient.InferRequestedOutput(name, binary_data=binary) for name in ("OUTPUT0", "OUTPUT1")]
        result = client.infer(model, tensors, outputs=outputs)
    return _as_bytes(result.as_numpy("OUTPUT0")), _as_bytes(result.as_numpy("OUTPUT1"))


def grpc_add_sub(url: str, model: str, *, typed: bool) -> tuple[list[bytes], list[bytes]]:
    """Over gRPC: tritonclient's raw contents (simple_grpc_string_infer_client), or typed ``bytes_contents``
    (simple_grpc_explicit_byte_content_client)."""
    first, second = (as_strings(values) for values in simple_inputs())
    request = service_pb2.ModelInferRequest(model_name=model)
    for name, data in (("INPUT0", first), ("INPUT1", second)):
        tensor = request.inputs.add(name=name, datatype="BYTES", shape=[1, ELEMENTS])
        if typed:
            tensor.contents.bytes_contents.extend(data.reshape(-1).tolist())
        else:
            request.raw_input_contents.append(serialize_byte_tensor(data).item())
    with grpc.insecure_channel(url) as channel:
        reply = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    found = {output.name: index for index, output in enumerate(reply.outputs)}
    sums, differences = (_as_bytes(deserialize_bytes_tensor(reply.raw_output_contents[found[name]]))
                         for name in ("OUTPUT0", "OUTPUT1"))
    return sums, differences


def identity(url: str, values: list[bytes]) -> list[bytes]:
    """``simple_identity`` over gRPC (raw contents): the strings it answers."""
    with grpcclient.InferenceServerClient(url) as client:
        tensor = grpcclient.InferInput("INPUT0", [1, len(values)], "BYTES")
        tensor.set_data_from_numpy(strings(values))
        return _as_bytes(client.infer("simple_identity", [tensor]).as_numpy("OUTPUT0"))


def index(url: str) -> dict[str, dict[str, str]]:
    """The repository index over HTTP, by model name (each model here has one version)."""
    entries = httpx.post(f"http://{url}/v2/repository/index", json={}, timeout=30).json()
    return {entry["name"]: entry for entry in entries}


def _as_bytes(values: object) -> list[bytes]:
    flat = np.asarray(values, dtype=np.object_).reshape(-1)
    return [v if isinstance(v, bytes) else str(v).encode() for v in flat.tolist()]
