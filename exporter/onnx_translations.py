"""One table of ONNX translations per process instead of one per export.

``torch.onnx.export`` (dynamo) rebuilds its registry of torchlib translations, some 1,600 functions, on every call:
about 0.4 s of each ONNX export on the dev box, more than the export of a small model itself. The registry is only
read once built, so a copy per opset serves every export, until an import registers new operators (torchvision's,
a user's ``torch.library`` ops), which makes a fresh one. torch is pinned (``torch==2.13.0``): the hook below is
checked by the exporter tests on every run of that version.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch.onnx._internal.exporter import _constants, _registration

_Registry = _registration.ONNXRegistry
_build = _Registry.__dict__["from_torchlib"]  # the classmethod object, to call and to put back
_tables: dict[tuple[int, int], Any] = {}
_lock = threading.Lock()


@contextlib.contextmanager
def shared_translations() -> Iterator[None]:
    """For the block's duration, ``ONNXRegistry.from_torchlib`` returns the process's table for that opset."""
    with _lock:
        _Registry.from_torchlib = classmethod(_cached)  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            _Registry.from_torchlib = _build  # type: ignore[method-assign]


def _cached(cls: type[Any], opset_version: int = _constants.TORCHLIB_OPSET) -> Any:
    # The count of registered operators tells when an import added some the table should translate.
    key = (opset_version, len(torch._C._dispatch_get_all_op_names()))
    table = _tables.get(key)
    if table is None:
        table = _tables[key] = _build.__func__(cls, opset_version=opset_version)
    return table
