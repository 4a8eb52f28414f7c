"""KServe v2 datatypes: names <-> numpy dtypes <-> ``model_config.proto`` types, and the checks that a client's
shape and values fit a datatype, shared by the REST and gRPC codecs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np
from tritonclient.grpc import model_config_pb2

from services.gateway.errors import InvalidInput, shown
from services.gateway.tensors.types import Array

BF16_DTYPE: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16)
"""numpy has no bfloat16; ml_dtypes' (tritonclient's choice too) is 2 bytes a value, the bit pattern Triton sends.
Its ``kind`` is ``"V"``, not ``"f"``: the codecs that branch on kinds name it where it differs from the floats."""
_NUMPY: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "BF16": BF16_DTYPE,
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}
"""BYTES arrays hold ``bytes`` objects (``bytes_tensors`` reads and writes them): their ``itemsize`` is a pointer's."""
MAX_RANK = 32
"""numpy 1.26's limit (2.x allows 64); it also keeps the shapes quoted in error messages short."""
MAX_DIM = 2**63 - 1
"""Triton's dims are int64."""
_FLOAT_LIMITS = {
    **{dtype: float(np.finfo(dtype).max) for dtype in _NUMPY.values() if dtype.kind == "f"},
    # np.finfo does not know bfloat16: float32's exponent range with 7 mantissa bits, (2 - 2**-7) * 2**127
    BF16_DTYPE: (2 - 2**-7) * 2.0**127,
}


def numpy_dtype(datatype: str, tensor: str) -> np.dtype[Any]:
    """The numpy dtype for a v2 datatype; unknown or unsupported ones are the client's error."""
    try:
        return _NUMPY[datatype]
    except KeyError:
        supported = ", ".join(_NUMPY)
        raise InvalidInput(
            f"input '{tensor}': datatype {shown(datatype)} is not supported; expected one of {supported}"
        ) from None


def from_config(data_type: int) -> str:
    """``TYPE_FP32`` (enum value) -> ``FP32``; ``TYPE_STRING`` is served as ``BYTES`` like Triton does."""
    name: str = model_config_pb2.DataType.Name(data_type)
    short = name.removeprefix("TYPE_")
    return "BYTES" if short == "STRING" else short


def checked_shape(shape: Sequence[int], tensor: str) -> tuple[int, ...]:
    """The dims as a tuple when a tensor may have them; each codec checks the element count against its data."""
    dims = tuple(shape)  # once: each pass over a protobuf repeated field costs a wrapper per element
    if len(dims) > MAX_RANK:
        raise InvalidInput(f"input '{tensor}': 'shape' has {len(dims)} dims; at most {MAX_RANK} are supported")
    if dims and (min(dims) < 0 or max(dims) > MAX_DIM):
        raise InvalidInput(f"input '{tensor}': 'shape' must be a list of non-negative integers, got {list(dims)}")
    return dims


def shaped(data: Array, shape: tuple[int, ...], tensor: str) -> Array:
    """``data.reshape(shape)``. The codecs checked the count, but with a 0 dim any other dim passes that check, and
    numpy refuses dims that multiply past what it can index even for an empty array."""
    try:
        return data.reshape(shape)
    except ValueError:
        raise InvalidInput(f"input '{tensor}': shape {list(shape)} is too large") from None


def narrow(wide: Array, dtype: np.dtype[Any], datatype: str, tensor: str) -> Array:
    """``wide`` cast to ``dtype`` once its values are known to fit: numpy would wrap integers silently and turn
    floats past the range into inf. Non-finite floats pass: the client asked for them by name, or sent them raw."""
    if wide.dtype == dtype or wide.size == 0:
        return wide.astype(dtype, copy=False)
    limit = _FLOAT_LIMITS.get(dtype)  # the floats, BF16 included
    if limit is not None:
        if np.count_nonzero(np.abs(wide) > limit):  # count_nonzero: cheaper than a ufunc reduction on small arrays
            over = np.isfinite(wide) & (np.abs(wide) > limit)  # past the range, unless +-inf on purpose
            if over.any():
                raise InvalidInput(
                    f"input '{tensor}': {float(wide[over][0])!r} is outside the {datatype} range "
                    f"-{limit:.8g}..{limit:.8g}"
                )
        return wide.astype(dtype)
    check_range(int(wide.min()), int(wide.max()), dtype, datatype, tensor)
    return wide.astype(dtype)


def check_range(low: int, high: int, dtype: np.dtype[Any], datatype: str, tensor: str) -> None:
    """Raise unless integers from ``low`` to ``high`` fit the integer ``dtype``."""
    info = np.iinfo(dtype)
    for value in (low, high):
        if not info.min <= value <= info.max:
            raise InvalidInput(f"input '{tensor}': {value} is outside the {datatype} range {info.min}..{info.max}")
