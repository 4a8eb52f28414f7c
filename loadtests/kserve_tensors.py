"""KServe v2 tensors for the locust users: a model's spec from its metadata, request inputs of the right shape and
datatype, and the checks that make a wrong answer (shape, datatype, size, model) a failure. Locust-free on purpose.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

DTYPES: dict[str, type[np.generic]] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
}


class WrongAnswer(Exception):
    """The gateway answered 200 with something that is not what the model's metadata promises."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str
    shape: tuple[int, ...]
    """As the metadata lists it: with the batch dim (-1) first when the model batches."""

    @classmethod
    def from_json(cls, tensor: Mapping[str, Any]) -> TensorSpec:
        datatype = str(tensor["datatype"])
        if datatype not in DTYPES:
            raise ValueError(f"tensor {tensor['name']!r} has datatype {datatype}, which the load test does not send")
        return cls(str(tensor["name"]), datatype, tuple(int(d) for d in tensor["shape"]))


@dataclass(frozen=True)
class ModelSpec:
    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    batching: bool
    versions: frozenset[str]

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], max_batch_size: int | None) -> ModelSpec:
        """``max_batch_size`` from the model's config; ``None`` when the config could not be read, then a leading
        -1 on every input is taken for the batch dim."""
        inputs = tuple(TensorSpec.from_json(t) for t in metadata["inputs"])
        outputs = tuple(TensorSpec.from_json(t) for t in metadata["outputs"])
        batching = all(t.shape[:1] == (-1,) for t in inputs) if max_batch_size is None else max_batch_size > 0
        return cls(str(metadata["name"]), inputs, outputs, batching, frozenset(str(v) for v in metadata["versions"]))

    def request_shape(self, tensor: TensorSpec, rows: int, dims: Mapping[str, Sequence[int]]) -> tuple[int, ...]:
        """The shape to send: ``rows`` for the batch dim, ``dims`` (per input name, ``""`` for all) for the others
        that are dynamic; a dynamic dim nobody set becomes 1."""
        fixed = tensor.shape[1:] if self.batching else tensor.shape
        given = dims.get(tensor.name, dims.get(""))
        if given is not None:
            if len(given) != len(fixed) or any(d not in (-1, g) for d, g in zip(fixed, given, strict=True)):
                raise ValueError(f"--shape {list(given)} does not fit input {tensor.name!r} of shape {list(fixed)}")
            fixed = tuple(given)
        row = tuple(1 if d == -1 else d for d in fixed)
        return (rows, *row) if self.batching else row

    def output_shape(self, tensor: TensorSpec, rows: int) -> tuple[int, ...]:
        """What an answer's shape must match; -1 matches any size."""
        return (rows, *tensor.shape[1:]) if self.batching else tensor.shape


def parse_dims(text: str) -> dict[str, tuple[int, ...]]:
    """``"32"`` (every input) or ``"features:32 image:3,64,64"`` → {name or "": dims}."""
    dims: dict[str, tuple[int, ...]] = {}
    for token in text.split():
        name, _, values = token.rpartition(":")
        try:
            dims[name] = tuple(int(v) for v in values.split(","))
        except ValueError:
            raise ValueError(f"--shape expects dims like 32 or image:3,64,64, got {token!r}") from None
    return dims


def random_inputs(
    spec: ModelSpec, rows: int, dims: Mapping[str, Sequence[int]], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    for tensor in spec.inputs:
        shape = spec.request_shape(tensor, rows, dims)
        dtype = DTYPES[tensor.datatype]
        if tensor.datatype == "BYTES":
            arrays[tensor.name] = np.array([f"row-{i}".encode() for i in range(math.prod(shape))], dtype=np.object_)
            arrays[tensor.name] = arrays[tensor.name].reshape(shape)
        elif tensor.datatype == "BOOL":
            arrays[tensor.name] = rng.random(shape) < 0.5
        elif np.issubdtype(dtype, np.integer):
            arrays[tensor.name] = rng.integers(0, 8, size=shape).astype(dtype)
        else:
            arrays[tensor.name] = rng.standard_normal(shape).astype(dtype)
    return arrays


def raw_bytes(array: np.ndarray) -> bytes:
    """The v2 binary form: little-endian C order, BYTES as 4-byte length prefixed elements."""
    if array.dtype == np.object_:
        return b"".join(struct.pack("<I", len(item)) + item for item in array.ravel())
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()


def json_body(spec: ModelSpec, arrays: Mapping[str, np.ndarray]) -> bytes:
    tensors = []
    for tensor in spec.inputs:
        array = arrays[tensor.name]
        data = [b.decode() for b in array.ravel()] if tensor.datatype == "BYTES" else array.ravel().tolist()
        tensors.append({"name": tensor.name, "shape": list(array.shape), "datatype": tensor.datatype, "data": data})
    return json.dumps({"inputs": tensors}).encode()


def binary_body(spec: ModelSpec, arrays: Mapping[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    """The binary tensor extension both ways: raw inputs after the JSON header, raw outputs asked for."""
    payloads = [raw_bytes(arrays[t.name]) for t in spec.inputs]
    tensors = [
        {
            "name": t.name,
            "shape": list(arrays[t.name].shape),
            "datatype": t.datatype,
            "parameters": {"binary_data_size": len(payload)},
        }
        for t, payload in zip(spec.inputs, payloads, strict=True)
    ]
    header = json.dumps({"inputs": tensors, "parameters": {"binary_data_output": True}}).encode()
    headers = {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"}
    return header + b"".join(payloads), headers


def check_output(spec: ModelSpec, rows: int, name: str, datatype: str, shape: Sequence[int]) -> int:
    """Checks one answered output's datatype and shape; returns its element count."""
    tensor = next((t for t in spec.outputs if t.name == name), None)
    if tensor is None:
        raise WrongAnswer(f"output {name!r} is not in the model's metadata")
    if datatype != tensor.datatype:
        raise WrongAnswer(f"output {name!r} has datatype {datatype}, expected {tensor.datatype}")
    expected = spec.output_shape(tensor, rows)
    if len(shape) != len(expected) or any(e not in (-1, s) for e, s in zip(expected, shape, strict=True)):
        raise WrongAnswer(f"output {name!r} has shape {list(shape)}, expected {list(expected)}")
    return math.prod(shape)


def check_outputs_named(spec: ModelSpec, names: Iterable[str]) -> None:
    got, expected = sorted(names), sorted(t.name for t in spec.outputs)
    if got != expected:
        raise WrongAnswer(f"the answer has outputs {got}, expected {expected}")


def check_model(spec: ModelSpec, model_name: str) -> None:
    if model_name != spec.name:
        raise WrongAnswer(f"the answer names model {model_name!r}, expected {spec.name!r}")


def json_answer(spec: ModelSpec, rows: int, body: bytes) -> str:
    """Checks a JSON answer; returns the version it names."""
    answer = json.loads(body)
    check_model(spec, answer.get("model_name"))
    outputs = answer["outputs"]
    check_outputs_named(spec, (o["name"] for o in outputs))
    for output in outputs:
        count = check_output(spec, rows, output["name"], output["datatype"], output["shape"])
        data = np.asarray(output["data"], dtype=object).ravel()
        if data.size != count:
            raise WrongAnswer(f"output {output['name']!r} carries {data.size} values for shape {output['shape']}")
    return str(answer.get("model_version"))


def binary_answer(spec: ModelSpec, rows: int, body: bytes, header_length: int) -> str:
    """Checks an answer in the binary extension (JSON header, then each output's raw bytes); returns its version."""
    answer = json.loads(body[:header_length])
    check_model(spec, answer.get("model_name"))
    outputs = answer["outputs"]
    check_outputs_named(spec, (o["name"] for o in outputs))
    offset = header_length
    for output in outputs:
        count = check_output(spec, rows, output["name"], output["datatype"], output["shape"])
        size = int(output.get("parameters", {}).get("binary_data_size", -1))
        if size < 0:
            raise WrongAnswer(f"output {output['name']!r} came as JSON although binary data was asked for")
        check_raw_size(output["name"], output["datatype"], count, body[offset : offset + size])
        offset += size
    if offset != len(body):
        raise WrongAnswer(f"the binary answer has {len(body)} bytes, its header accounts for {offset}")
    return str(answer.get("model_version"))


def check_raw_size(name: str, datatype: str, count: int, raw: bytes) -> None:
    """Raw output bytes hold ``count`` elements: fixed-size items, or length-prefixed BYTES elements."""
    if datatype != "BYTES":
        expected = count * np.dtype(DTYPES[datatype]).itemsize
        if len(raw) != expected:
            raise WrongAnswer(f"output {name!r} has {len(raw)} bytes, expected {expected}")
        return
    offset, elements = 0, 0
    while offset + 4 <= len(raw):
        offset += 4 + struct.unpack_from("<I", raw, offset)[0]
        elements += 1
    if offset != len(raw) or elements != count:
        raise WrongAnswer(f"output {name!r} holds {elements} BYTES elements in {len(raw)} bytes, expected {count}")


class ServedVersions:
    """The versions the gateway serves (its metadata's ``versions``). An answer from a version not seen before
    makes it read them again once: a version activated during the run is served, an unknown one is a failure."""

    def __init__(self, versions: Iterable[str], read: Callable[[], Iterable[str]]) -> None:
        self._versions = set(versions)
        self._read = read

    def check(self, version: str, header: str | None = None) -> None:
        if header is not None and header != version:
            raise WrongAnswer(f"X-Model-Version says {header!r}, the body says {version!r}")
        if version in self._versions:
            return
        self._versions |= set(self._read())
        if version not in self._versions:
            raise WrongAnswer(f"answered by version {version!r}; the gateway serves {sorted(self._versions)}")
