"""KServe v2 datatype names <-> numpy dtypes <-> ``model_config.proto`` data types."""

from __future__ import annotations

from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2

from services.gateway.errors import InvalidInput

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
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}


def numpy_dtype(datatype: str, tensor: str) -> np.dtype[Any]:
    """The numpy dtype for a v2 datatype; unknown or unsupported ones are the client's error."""
    try:
        return _NUMPY[datatype]
    except KeyError:
        supported = ", ".join(_NUMPY)
        raise InvalidInput(
            f"input '{tensor}': datatype {datatype!r} is not supported; expected one of {supported}"
        ) from None


def from_config(data_type: int) -> str:
    """``TYPE_FP32`` (enum value) -> ``FP32``; ``TYPE_STRING`` is served as ``BYTES`` like Triton does."""
    name: str = model_config_pb2.DataType.Name(data_type)
    short = name.removeprefix("TYPE_")
    return "BYTES" if short == "STRING" else short
