"""One table for torch dtype <-> Triton datatype names, shared by configs, manifests and checks."""

from __future__ import annotations

import torch

from exporter.errors import InvalidSpecError

_TORCH_TO_TRITON: dict[torch.dtype, str] = {
    torch.bool: "BOOL",
    torch.uint8: "UINT8",
    torch.int8: "INT8",
    torch.int16: "INT16",
    torch.int32: "INT32",
    torch.int64: "INT64",
    torch.float16: "FP16",
    torch.bfloat16: "BF16",
    torch.float32: "FP32",
    torch.float64: "FP64",
}
_TRITON_TO_TORCH = {name: dtype for dtype, name in _TORCH_TO_TRITON.items()}

TRITON_DATATYPES = frozenset(_TRITON_TO_TORCH)


def triton_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"FP32"``; raises for dtypes Triton cannot carry (complex, fp8...)."""
    try:
        return _TORCH_TO_TRITON[dtype]
    except KeyError:
        supported = ", ".join(str(d).removeprefix("torch.") for d in _TORCH_TO_TRITON)
        raise InvalidSpecError(
            f"tensor dtype {dtype} cannot be served by Triton; use one of: {supported}"
        ) from None


def torch_dtype(name: str) -> torch.dtype:
    """``"FP32"`` (or ``"TYPE_FP32"``) -> ``torch.float32``."""
    key = name.upper().removeprefix("TYPE_")
    try:
        return _TRITON_TO_TORCH[key]
    except KeyError:
        raise InvalidSpecError(
            f"unknown datatype {name!r}; expected one of {', '.join(sorted(TRITON_DATATYPES))}"
        ) from None


def config_type(name: str) -> str:
    """Triton datatype name as written in ``config.pbtxt`` (``FP32`` -> ``TYPE_FP32``)."""
    return "TYPE_" + name.upper().removeprefix("TYPE_")
