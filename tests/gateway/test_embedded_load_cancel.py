"""A load on the embedded backend whose caller goes away (a gRPC client's deadline passes, an action is cancelled):
nothing of it stays. Its version was once left LOADING for good: every later load was refused as "already loading"
and the model could not be served again until a restart."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from services.gateway.backends.embedded import EmbeddedBackend
from services.gateway.repository import Catalog
from services.gateway.tensors.types import VersionState

CONFIG = """
name: "double"
platform: "onnxruntime_onnx"
max_batch_size: 8
input { name: "x" data_type: TYPE_FP32 dims: [ 4 ] }
output { name: "y" data_type: TYPE_FP32 dims: [ 4 ] }
"""


def write_double(root: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"])], "double",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (root / "double" / "2").mkdir(parents=True)
    onnx.save(model, root / "double" / "2" / "model.onnx")
    (root / "double" / "config.pbtxt").write_text(CONFIG)


async def test_a_cancelled_load_leaves_no_version_behind_and_the_next_load_succeeds(tmp_path: Path) -> None:
    write_double(tmp_path)
    catalog = Catalog(tmp_path)
    catalog.scan()
    backend = EmbeddedBackend(catalog)
    await backend.start({})
    try:
        loading = asyncio.create_task(backend.load("double", 2))
        while backend.state("double", 2) is not VersionState.LOADING:  # it reached the model file's read
            await asyncio.sleep(0)
        loading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loading

        assert backend.state("double", 2) is None
        assert backend.models()["double"] == {}

        await backend.load("double", 2)
        assert backend.state("double", 2) is VersionState.READY
    finally:
        await backend.close()
