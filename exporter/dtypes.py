"""One table for torch dtype <-> Triton datatype names, shared by configs, manifests and checks.

Keyed by the dtype's name, not the ``torch.dtype`` object, so that importing it (and ``exporter.specs``)
does not import torch: only ``torch_dtype`` needs torch, and imports it when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from exporter.errors import InvalidSpecError

if TYPE_CHECKING:
    from typing import Any

    import numpy.typing as npt
    import torch

_TORCH_TO_TRITON = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "bfloat16": "BF16",
    "float32": "FP32",
    "float64": "FP64",
}
_TRITON_TO_TORCH = {name: dtype for dtype, name in _TORCH_TO_TRITON.items()}

TRITON_DATATYPES = frozenset(_TRITON_TO_TORCH)


def triton_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"FP32"``; raises for dtypes Triton cannot carry (complex, fp8...)."""
    try:
        # str() of a dtype is its canonical name (torch.half prints as torch.float16).
        return _TORCH_TO_TRITON[str(dtype).removeprefix("torch.")]
    except KeyError:
        supported = ", ".join(_TORCH_TO_TRITON)
        raise InvalidSpecError(
            f"tensor dtype {dtype} cannot be served by Triton; use one of: {supported}"
        ) from None


def torch_dtype(name: str) -> torch.dtype:
    """``"FP32"`` (or ``"TYPE_FP32"``) -> ``torch.float32``."""
    import torch

    key = name.upper().removeprefix("TYPE_")
    try:
        dtype: torch.dtype = getattr(torch, _TRITON_TO_TORCH[key])
    except KeyError:
        raise InvalidSpecError(
            f"unknown datatype {name!r}; expected one of {', '.join(sorted(TRITON_DATATYPES))}"
        ) from None
    return dtype


def config_type(name: str) -> str:
    """Triton datatype name as written in ``config.pbtxt`` (``FP32`` -> ``TYPE_FP32``)."""
    return "TYPE_" + name.upper().removeprefix("TYPE_")


def as_numpy(tensor: torch.Tensor) -> npt.NDArray[Any]:
    """The tensor's values as a numpy array on the CPU. numpy has no bfloat16: a BF16 tensor comes back as float32,
    which holds every bfloat16 value exactly, so comparisons and saved samples keep the numbers."""
    import torch

    cpu = tensor.detach().cpu()
    return (cpu.float() if cpu.dtype == torch.bfloat16 else cpu).numpy()


def raw_bytes(tensor: torch.Tensor) -> bytes:
    """The tensor's elements as Triton reads raw tensor data: row-major, little-endian, the datatype's own width
    (2 bytes for BF16, its bit pattern, which numpy cannot hold as a number)."""
    import torch

    cpu = tensor.detach().cpu().contiguous()
    if cpu.dtype == torch.bfloat16:
        cpu = cpu.view(torch.int16)
    return bytes(cpu.numpy().tobytes())
