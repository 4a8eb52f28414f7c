"""Blocking model runners for the embedded backend; they are called from a thread pool (onnxruntime and
libtorch release the GIL while they compute). torch is imported only when a TorchScript model loads.

BYTES tensors reach the runtimes as text: onnxruntime's string tensors and TorchScript's ``str`` are UTF-8, so
``runtime_inputs`` decodes them before a request is queued (an element that is not UTF-8 is that request's 400, not
its batch's failure) and the runners encode string outputs back to the gateway's ``bytes``. onnxruntime takes
object arrays of ``str`` of any shape; TorchScript takes a ``List[str]``, hence only 1-D BYTES tensors, as with
Triton's PyTorch backend.

BF16 tensors are ml_dtypes' bfloat16 arrays in the gateway, a type neither runtime's numpy bridge knows: onnxruntime
takes and gives them as ``OrtValue``s of their bit patterns (only for models that have them: the others keep the
plain ``session.run``), TorchScript as int16 tensors viewed as ``torch.bfloat16``."""

from __future__ import annotations

import ctypes
import itertools
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort
from tritonclient.grpc import model_config_pb2

from services.extras import require
from services.gateway.backends.data_dependence import onnx_data_dependent_ops, torchscript_data_dependent_kinds
from services.gateway.backends.devices import CPU, CPU_PROVIDER, FALLBACK_SETTING, Device, NoUsableGpu, onnx_providers
from services.gateway.errors import InvalidInput
from services.gateway.tensors.bytes_codec import BYTES, decoded, encoded, is_bytes
from services.gateway.tensors.datatypes import BF16_DTYPE
from services.gateway.tensors.types import Array, InferInput
from services.modelrepo import layout

_ORT_BFLOAT16 = "tensor(bfloat16)"
_ORT_STRING = "tensor(string)"
_ONNX_BFLOAT16 = 16
"""``onnx.TensorProto.BFLOAT16``, which ``OrtValue`` creation takes (onnx itself is not in a base install)."""
_NOT_FROM_NUMPY = "OV"
"""The kinds ``torch.from_numpy`` cannot take: BYTES' objects, bfloat16's (``BF16_DTYPE``)."""


class Runner(Protocol):
    data_dependent: frozenset[str]
    """The model's ops whose work follows input values, not only their shapes (empty: its cost follows shapes)."""

    def run(self, inputs: dict[str, Array]) -> dict[str, Array]:
        """Inputs and outputs keyed by config tensor name, batch dim first."""


class UnsupportedModel(Exception):
    """A model the embedded backend cannot run by design (its platform, or an extra that is not installed)."""


def check_supported(platform: str) -> None:
    """Raise ``UnsupportedModel`` naming why a model of ``platform`` cannot run in this process."""
    if platform == layout.ONNX_PLATFORM:
        return
    if platform == layout.TORCHSCRIPT_PLATFORM:
        require("torch", extra="export", feature="serving a TorchScript model in the embedded backend")
        return
    raise UnsupportedModel(
        f"platform/backend {platform or '(none)'!r} cannot run in the embedded backend, which runs "
        f"{layout.ONNX_PLATFORM} and {layout.TORCHSCRIPT_PLATFORM} models; serve it with --backend triton"
    )


def check_string_ranks(config: model_config_pb2.ModelConfig, model: str) -> None:
    """Refuse a TorchScript model with a BYTES input of more than one dimension, batch dim included: no request
    could reach it as a ``List[str]``. Triton's PyTorch backend refuses the load too."""
    if layout.platform(config) != layout.TORCHSCRIPT_PLATFORM:
        return
    for tensor in config.input:
        dims = [*([-1] if config.max_batch_size > 0 else []), *tensor.dims]
        if tensor.data_type == model_config_pb2.TYPE_STRING and len(dims) > 1:
            raise UnsupportedModel(
                f"TorchScript model '{model}' input '{tensor.name}' is BYTES: TorchScript takes strings as a "
                f"List[str], so only 1-D BYTES tensors can be served (as with Triton's PyTorch backend); the config "
                f"declares {len(dims)} dimensions{' (the batch dim included)' if config.max_batch_size > 0 else ''}"
            )


def build_runner(
    platform: str,
    path: Path,
    inputs: list[str],
    outputs: list[str],
    *,
    threads: int,
    spinning: bool,
    devices: tuple[Device, ...] = (CPU,),
    tensorrt: bool = False,
) -> Runner:
    """A runner on each distinct device of ``devices`` (the instances' places, ``devices.plan_instances``); several
    take the batches in turn."""
    runners: list[Runner] = []
    for device in sorted(set(devices)):
        if platform == layout.ONNX_PLATFORM:
            runners.append(OnnxRunner(path, outputs, intra_op_threads=threads, spinning=spinning,
                                      providers=onnx_providers(device, tensorrt=tensorrt)))
        else:
            check_supported(platform)
            runners.append(TorchScriptRunner(path, inputs, outputs, threads=threads, device=str(device)))
    return runners[0] if len(runners) == 1 else DeviceRotation(runners)


class DeviceRotation:
    """Runners of one version on several devices (a KIND_GPU group over ``gpus: [0, 1]``): each batch goes to the
    next, so the instances' threads keep every device busy."""

    def __init__(self, runners: list[Runner]) -> None:
        self._runners = runners
        self._turn = itertools.count()
        self.data_dependent = frozenset().union(*(r.data_dependent for r in runners))

    def run(self, inputs: dict[str, Array]) -> dict[str, Array]:
        # next() on itertools.count is atomic under the GIL: the pool's threads never take the same turn.
        return self._runners[next(self._turn) % len(self._runners)].run(inputs)


def _provider_name(provider: Any) -> str:
    """A provider as ``InferenceSession`` takes it: its name, or ``(name, options)``."""
    return str(provider[0] if isinstance(provider, tuple) else provider)


class OnnxRunner:
    def __init__(
        self,
        path: Path,
        output_names: list[str],
        *,
        intra_op_threads: int,
        spinning: bool,
        providers: list[Any] | None = None,
    ) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Spinning intra-op threads burn the cores the event loop needs between batches.
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
        self._session: Any = ort.InferenceSession(str(path), options, providers=providers or [CPU_PROVIDER])
        wanted = _provider_name((providers or [CPU_PROVIDER])[0])
        started = self._session.get_providers()
        if wanted != CPU_PROVIDER and wanted not in started:
            # onnxruntime runs the session on the CPU, with a log line only, when a GPU provider it offers cannot
            # start (no driver, a CUDA or cuDNN library missing): a KIND_GPU model must not serve there unnoticed.
            raise NoUsableGpu(
                f"onnxruntime could not start {wanted} for {path.name} (the session came up on "
                f"{', '.join(started)}; onnxruntime's log above says which driver or library it missed); set "
                f"{FALLBACK_SETTING}=cpu to run it on the CPU instead"
            )
        self._outputs = output_names
        self.data_dependent = frozenset(onnx_data_dependent_ops(path))
        inputs, outputs = self._session.get_inputs(), self._session.get_outputs()
        self._bfloat16_inputs = frozenset(v.name for v in inputs if v.type == _ORT_BFLOAT16)
        if self._bfloat16_inputs or any(v.type == _ORT_BFLOAT16 for v in outputs):
            strings = [v.name for v in (*inputs, *outputs) if v.type == _ORT_STRING]
            if strings:
                raise UnsupportedModel(
                    f"{path.name} has bfloat16 tensors, which onnxruntime's Python API passes only as OrtValues, and "
                    f"string tensors ({', '.join(strings)}), which it cannot pass that way: the embedded backend "
                    "cannot run it; serve it with --backend triton"
                )
            # Chosen once here: models without bfloat16 keep the plain call, with no test per batch.
            self.run = self._run_bound  # type: ignore[method-assign]

    def run(self, inputs: dict[str, Array]) -> dict[str, Array]:
        results = self._session.run(self._outputs, inputs)
        return {name: encoded(r, name) if is_bytes(r) else r for name, r in zip(self._outputs, results, strict=True)}

    def _run_bound(self, inputs: dict[str, Array]) -> dict[str, Array]:
        """``run`` for a model with bfloat16 tensors: ``session.run`` converts through numpy types, which have no
        bfloat16, so the tensors go through an I/O binding, bfloat16 ones as ``OrtValue``s of their bit patterns."""
        binding = self._session.io_binding()
        borrowed = []  # an OrtValue borrows its array's memory: these live until the run is over
        for name, array in inputs.items():
            if name in self._bfloat16_inputs:
                bits = np.ascontiguousarray(array).view(np.uint16)
                borrowed.append(bits)
                binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, _ONNX_BFLOAT16))
            else:
                binding.bind_cpu_input(name, array)
        for name in self._outputs:
            binding.bind_output(name, "cpu")  # on the host whatever the provider: that is where the codecs read them
        self._session.run_with_iobinding(binding)
        values = binding.get_outputs()
        return {name: _host_array(value) for name, value in zip(self._outputs, values, strict=True)}


def _host_array(value: Any) -> Array:
    """An output ``OrtValue`` on the host as an array; ``OrtValue.numpy()`` has no type for bfloat16: its bytes are
    copied out instead."""
    if value.data_type() != _ORT_BFLOAT16:
        return value.numpy()  # type: ignore[no-any-return]
    array = np.empty(value.shape(), dtype=BF16_DTYPE)
    ctypes.memmove(array.ctypes.data, value.data_ptr(), value.tensor_size_in_bytes())
    return array


class TorchScriptRunner:
    def __init__(
        self, path: Path, input_names: list[str], output_names: list[str], *, threads: int, device: str = "cpu"
    ) -> None:
        self._torch: Any = require("torch", extra="export", feature="serving a TorchScript model")
        self._torch.set_num_threads(threads)
        self._device = device
        if device.startswith("cuda"):
            # fp32 as exported: TF32 would round convolutions and matrix products to a 10-bit mantissa (~1e-3), past
            # the exporter's parity tolerance (1e-4), and answer otherwise than the version that passed it.
            self._torch.backends.cudnn.allow_tf32 = False
            self._torch.backends.cuda.matmul.allow_tf32 = False
        self._module = self._torch.jit.load(str(path), map_location=device).eval()
        self.data_dependent = frozenset(torchscript_data_dependent_kinds(self._module))
        self._inputs = input_names
        self._outputs = output_names

    def run(self, inputs: dict[str, Array]) -> dict[str, Array]:
        torch = self._torch
        # torch.from_numpy shares memory but refuses read-only buffers (frombuffer'd request bodies).
        args = [_torch_value(torch, inputs[name], self._device) for name in self._inputs]
        with torch.inference_mode():
            result = self._module(*args)
        if isinstance(result, torch.Tensor) or _is_strings(result):  # a List[str] is one output, not several
            values = [result]
        elif isinstance(result, dict):
            values = [result[name] for name in self._outputs]
        else:
            values = list(result)
        if len(values) != len(self._outputs):
            raise RuntimeError(f"TorchScript module returned {len(values)} outputs, config lists {len(self._outputs)}")
        return {name: _numpy_value(torch, name, value) for name, value in zip(self._outputs, values, strict=True)}


def runtime_inputs(config: model_config_pb2.ModelConfig, model: str, inputs: list[InferInput]) -> dict[str, Array]:
    """A request's inputs keyed by name as the model's runtime takes them: BYTES decoded to ``str``."""
    if BYTES not in [tensor.datatype for tensor in inputs]:
        return {tensor.name: tensor.data for tensor in inputs}
    torchscript = layout.platform(config) == layout.TORCHSCRIPT_PLATFORM
    found = {}
    for tensor in inputs:
        data = tensor.data
        if tensor.datatype == BYTES:
            if torchscript and data.ndim != 1:
                raise InvalidInput(
                    f"TorchScript model '{model}' input '{tensor.name}' is BYTES: TorchScript takes strings as a "
                    f"List[str], so only 1-D BYTES tensors can be served (as with Triton's PyTorch backend); got "
                    f"shape {list(data.shape)}"
                )
            runtime = "TorchScript strings" if torchscript else "onnxruntime string tensors"
            data = decoded(data, tensor.name, f"{runtime} hold UTF-8 text")
        found[tensor.name] = data
    return found


def _torch_value(torch: Any, array: Array, device: str) -> Any:
    if array.dtype.kind in _NOT_FROM_NUMPY:
        if is_bytes(array):  # decoded by runtime_inputs: a 1-D array of str
            return array.tolist()
        bits = array.view(np.int16)  # bfloat16: torch takes its bit patterns as int16, then views them as its own
        tensor = torch.from_numpy(bits if bits.flags.writeable else np.array(bits)).view(torch.bfloat16)
    else:
        tensor = torch.from_numpy(array if array.flags.writeable else np.array(array))
    # The batch was assembled on the host once; one copy takes it to the device (pinned: the copy runs without the
    # pageable staging buffer).
    return tensor if device == "cpu" else tensor.pin_memory().to(device, non_blocking=True)


def _is_strings(value: Any) -> bool:
    return isinstance(value, list) and (not value or isinstance(value[0], str))


def _numpy_value(torch: Any, name: str, value: Any) -> Array:
    if isinstance(value, torch.Tensor):
        host = value.cpu()  # one copy back from a device; none on the CPU
        try:
            return host.numpy()  # type: ignore[no-any-return]
        except TypeError:  # numpy has no bfloat16 for torch to give: its bit patterns, viewed as ml_dtypes' type
            if host.dtype != torch.bfloat16:
                raise
            return host.view(torch.int16).numpy().view(BF16_DTYPE)  # type: ignore[no-any-return]
    if _is_strings(value):  # a List[str] output
        return encoded(np.array(value, dtype=object).reshape(len(value)), name)
    raise RuntimeError(f"TorchScript module returned {type(value).__name__} for output '{name}'")
