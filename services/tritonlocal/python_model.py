"""Triton python-backend model that serves an ONNX or TorchScript model file on CPU.

Not imported by Switchyard: the derived-repository builder copies this file as ``<model>/<version>/model.py``
and Triton's python stub runs it, inside the stub env (numpy < 2, onnxruntime, torch).

String (BYTES) tensors arrive as object arrays of ``bytes``; onnxruntime's python API takes them only as ``str``
(it would run ``str()`` on ``bytes``), TorchScript as a ``List[str]``: inputs are decoded (an element that is not
UTF-8 is that request's INVALID_ARG) and string outputs encoded back to ``bytes``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]

Array = npt.NDArray[Any]
Runner = Callable[[Sequence[Array]], list[Array]]


class TritonPythonModel:
    """Runs every request of a dynamic batch in one call, grouped by the shape of their rows."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        self.batched = int(config.get("max_batch_size", 0)) > 0
        self.inputs = [(t["name"], pb_utils.triton_string_to_numpy(t["data_type"])) for t in config["input"]]
        self.outputs = [(t["name"], pb_utils.triton_string_to_numpy(t["data_type"])) for t in config["output"]]
        folder = Path(args["model_repository"]) / args["model_version"]
        # Each instance is its own stub process: share the cores between them instead of each taking all.
        instances = sum(int(group.get("count", 1)) for group in config.get("instance_group", [])) or 1
        threads = max(1, (os.cpu_count() or 1) // instances)
        # The derived config names the model file and its runtime (services/tritonlocal/derive.py).
        parameters = config.get("parameters", {})
        artifact = parameters.get("switchyard_artifact", {}).get("string_value", "")
        runtime = parameters.get("switchyard_runtime", {}).get("string_value", "")
        if not artifact or runtime not in ("onnx", "torchscript"):
            raise pb_utils.TritonModelException("config lacks the switchyard_artifact / switchyard_runtime parameters")
        if not (folder / artifact).exists():
            raise pb_utils.TritonModelException(f"{folder} holds no {artifact}")
        if runtime == "onnx":
            names = ([n for n, _ in self.inputs], [n for n, _ in self.outputs])
            self.run: Runner = _onnx_runner(folder / artifact, *names, threads=threads)
        else:
            self.run = _torch_runner(folder / artifact, threads=threads)
        self.torchscript = runtime == "torchscript"

    def execute(self, requests: list[Any]) -> list[Any]:
        responses: list[Any] = [None] * len(requests)
        groups: dict[tuple[object, ...], list[tuple[int, list[Array]]]] = {}
        for index, request in enumerate(requests):
            try:
                arrays = self._read_inputs(request)
            except ValueError as exc:
                responses[index] = _error(str(exc), getattr(pb_utils.TritonError, "INVALID_ARG", None))
                continue
            # Rows concatenate only when every non-batch dim agrees (inputs with dynamic dims may not).
            key = tuple(a.shape[1:] for a in arrays) if self.batched else (index,)
            groups.setdefault(key, []).append((index, arrays))
        for members in groups.values():
            self._run_group(members, responses)
        return responses

    def _read_inputs(self, request: Any) -> list[Array]:
        arrays: list[Array] = []
        for name, dtype in self.inputs:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is None:
                raise ValueError(f"input '{name}' is missing")
            array = tensor.as_numpy()
            if array.dtype != dtype:
                raise ValueError(f"input '{name}' has dtype {array.dtype}, the model expects {np.dtype(dtype)}")
            arrays.append(_text(name, array, self.torchscript) if array.dtype == np.object_ else array)
        if self.batched and len({a.shape[0] if a.ndim else -1 for a in arrays}) != 1:
            raise ValueError("all inputs of a request must have the same batch size")
        return arrays

    def _run_group(self, members: list[tuple[int, list[Array]]], responses: list[Any]) -> None:
        rows = [arrays[0].shape[0] if self.batched else 0 for _, arrays in members]
        try:
            if len(members) == 1:
                outputs = self.run(members[0][1])
            else:
                outputs = self.run([np.concatenate(column) for column in zip(*(a for _, a in members), strict=True)])
            parts = self._split(outputs, rows)
        except Exception as exc:  # the runtime's own errors: answer them, never crash the stub
            if len(members) > 1:  # find the request that caused it, answer the others
                for member in members:
                    self._run_group([member], responses)
                return
            responses[members[0][0]] = _error(f"inference failed: {type(exc).__name__}: {exc}")
            return
        for (index, _), part in zip(members, parts, strict=True):
            tensors = [
                pb_utils.Tensor(name, _encoded(a) if dtype == np.object_ else np.ascontiguousarray(a, dtype=dtype))
                for (name, dtype), a in zip(self.outputs, part, strict=True)
            ]
            responses[index] = pb_utils.InferenceResponse(output_tensors=tensors)

    def _split(self, outputs: list[Array], rows: list[int]) -> list[list[Array]]:
        if len(outputs) != len(self.outputs):
            raise ValueError(f"the model returned {len(outputs)} outputs, the config declares {len(self.outputs)}")
        if not self.batched:
            return [outputs]
        total = sum(rows)
        for (name, _), array in zip(self.outputs, outputs, strict=True):
            if array.ndim == 0 or array.shape[0] != total:
                raise ValueError(f"output '{name}' has shape {array.shape}, expected {total} rows first")
        offsets = np.cumsum(rows)[:-1]
        per_output = [np.split(array, offsets) for array in outputs]
        return [list(part) for part in zip(*per_output, strict=True)]


def _error(message: str, code: Any = None) -> Any:
    error = pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)
    return pb_utils.InferenceResponse(output_tensors=[], error=error)


def _text(name: str, array: Array, torchscript: bool) -> Array:
    """A BYTES input as ``str`` elements; ``ValueError`` (the client's fault) naming the element that is not UTF-8."""
    if torchscript and array.ndim != 1:
        raise ValueError(f"input '{name}' is BYTES of shape {list(array.shape)}: TorchScript takes only 1-D strings")
    flat = array.reshape(-1).tolist()
    strings = []
    for index, value in enumerate(flat):
        try:
            strings.append(value.decode() if isinstance(value, bytes) else str(value))
        except UnicodeDecodeError as exc:
            reason = f"{exc.reason} at byte {exc.start}"
            raise ValueError(f"input '{name}': string {index} is not valid UTF-8 ({reason})") from None
    result = np.empty(len(strings), dtype=np.object_)
    result[:] = strings
    return result.reshape(array.shape)


def _encoded(array: Any) -> Array:
    """A string output (``str`` or ``bytes`` elements, or a TorchScript ``List[str]``) as an object array of bytes."""
    values = np.array(array, dtype=np.object_) if isinstance(array, np.ndarray) else _strings(array)
    flat = [v.encode() if isinstance(v, str) else v for v in values.reshape(-1).tolist()]
    result = np.empty(len(flat), dtype=np.object_)
    result[:] = flat
    return result.reshape(values.shape)


def _strings(values: list[str]) -> Array:
    result = np.empty(len(values), dtype=np.object_)
    result[:] = values
    return result


def _onnx_runner(path: Path, input_names: list[str], output_names: list[str], *, threads: int) -> Runner:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    # Spinning worker threads burn the cores the other instances, the gateway and its clients need.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feeds = [i.name for i in session.get_inputs()]
    fetches = [o.name for o in session.get_outputs()]
    # The exporter names the graph's tensors as the config does; fall back to position otherwise.
    feed_names = input_names if set(input_names) == set(feeds) else feeds
    fetch_names = output_names if set(output_names) <= set(fetches) else fetches

    def run(arrays: Sequence[Array]) -> list[Array]:
        return list(session.run(fetch_names, dict(zip(feed_names, arrays, strict=True))))

    return run


def _torch_runner(path: Path, *, threads: int) -> Runner:
    import torch

    torch.set_num_threads(threads)
    module = torch.jit.load(str(path), map_location="cpu").eval()  # type: ignore[no-untyped-call]

    def run(arrays: Sequence[Array]) -> list[Array]:
        with torch.inference_mode():
            result = module(*(_torch_value(torch, a) for a in arrays))
        strings = isinstance(result, list) and (not result or isinstance(result[0], str))
        if isinstance(result, torch.Tensor) or strings:
            result = (result,)  # one tensor, or one List[str]
        elif isinstance(result, dict):
            result = tuple(result.values())
        return [t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else _encoded(t) for t in result]

    return run


def _torch_value(torch: Any, array: Array) -> Any:
    if array.dtype == np.object_:  # decoded by _text: a 1-D array of str, which TorchScript takes as List[str]
        return array.tolist()
    # torch refuses read-only numpy views (inputs can live in the stub's shared memory).
    return torch.from_numpy(array if array.flags.writeable else array.copy())
