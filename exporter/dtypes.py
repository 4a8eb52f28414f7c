"""One table for torch dtype <-> Triton datatype names, shared by configs, manifests and checks.

Keyed by the dtype's name, not the ``torch.dtype`` object, so that importing it (and ``exporter.specs``)
does not import torch: only ``torch_dtype`` needs torch, and imports it when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from exporter.errors import InvalidSpecError

if TYPE_CHECKING:
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
