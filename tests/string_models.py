"""Models with string (BYTES) tensors, built by hand as other tools would make them (the exporter makes none):
``echo`` (ONNX ``Identity`` on a string tensor, batching), ``word_ids`` (ONNX ``LabelEncoder``: strings in, int64
ids out; warmed up from a serialized-strings file and with ``random_data``), ``echo_ts`` (a scripted TorchScript
module taking and returning ``List[str]``) and ``echo_ts_2d`` (the same, declared 2-D), and the values the tests
send through them."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper

VOCABULARY = {"hello": 1, "world": 2, "grüße": 3, "日本語": 4}
"""word_ids' vocabulary; any other word is -1."""
TEXT = ["hello", "", "grüße", "日本語", "🚀 emoji", "tab\tand\nnewline", "nul\x00inside", "x" * 300]
"""Strings every path must carry exactly: empty, non-ASCII, emoji, control characters, an embedded NUL, long."""
NOT_UTF8 = [b"\xff\xfe", b"ok", b"\xc3"]
"""Bytes that no JSON string holds and no onnxruntime string tensor takes."""

ECHO_CONFIG = """
name: "echo"
platform: "onnxruntime_onnx"
max_batch_size: 8
input { name: "text" data_type: TYPE_STRING dims: [ -1 ] }
output { name: "echo" data_type: TYPE_STRING dims: [ -1 ] }
dynamic_batching { max_queue_delay_microseconds: 2000 }
"""
WORD_IDS_CONFIG = """
name: "word_ids"
platform: "onnxruntime_onnx"
max_batch_size: 8
input { name: "words" data_type: TYPE_STRING dims: [ -1 ] }
output { name: "ids" data_type: TYPE_INT64 dims: [ -1 ] }
model_warmup {
  name: "vocabulary" batch_size: 2
  inputs { key: "words" value: { data_type: TYPE_STRING dims: [ 4 ] input_data_file: "words.bin" } }
}
model_warmup {
  name: "random" batch_size: 1
  inputs { key: "words" value: { data_type: TYPE_STRING dims: [ 3 ] random_data: true } }
}
"""
ECHO_TS_CONFIG = """
name: "echo_ts"
platform: "pytorch_libtorch"
max_batch_size: 0
input { name: "INPUT__0" data_type: TYPE_STRING dims: [ -1 ] }
output { name: "OUTPUT__0" data_type: TYPE_STRING dims: [ -1 ] }
"""


def strings(values: list[str] | list[bytes], shape: tuple[int, ...] | None = None) -> npt.NDArray[np.object_]:
    """What a tritonclient user passes for BYTES: an object array of ``bytes`` (str values are encoded)."""
    array = np.empty(len(values), dtype=np.object_)
    array[:] = [v.encode() if isinstance(v, str) else v for v in values]
    return array.reshape(shape if shape is not None else (1, len(values)))


def serialized(values: list[str]) -> bytes:
    """Triton's serialized form of strings, written out by hand: each a 4-byte little-endian length, then UTF-8."""
    return b"".join(struct.pack("<I", len(v.encode())) + v.encode() for v in values)


def string_repository(root: Path, *, torchscript: bool = True) -> Path:
    _write_onnx(root / "echo", ECHO_CONFIG, [helper.make_node("Identity", ["text"], ["echo"])], "text", "echo")
    encoder = helper.make_node(
        "LabelEncoder", ["words"], ["ids"], domain="ai.onnx.ml",
        keys_strings=list(VOCABULARY), values_int64s=list(VOCABULARY.values()), default_int64=-1,
    )
    _write_onnx(root / "word_ids", WORD_IDS_CONFIG, [encoder], "words", "ids", output_type=TensorProto.INT64)
    (root / "word_ids" / "warmup").mkdir()
    (root / "word_ids" / "warmup" / "words.bin").write_bytes(serialized(list(VOCABULARY)))
    if torchscript:
        _write_torchscript(root / "echo_ts", ECHO_TS_CONFIG)
        # The same module declared with 2-D strings: a TorchScript List[str] cannot take them.
        _write_torchscript(root / "echo_ts_2d", ECHO_TS_CONFIG.replace('"echo_ts"', '"echo_ts_2d"').replace(
            "dims: [ -1 ]", "dims: [ -1, -1 ]"))
    return root


def _write_onnx(
    folder: Path, config: str, nodes: list[onnx.NodeProto], source: str, target: str,
    output_type: int = TensorProto.STRING,
) -> None:
    (folder / "1").mkdir(parents=True)
    graph = helper.make_graph(
        nodes,
        folder.name,
        [helper.make_tensor_value_info(source, TensorProto.STRING, ["n", "m"])],
        [helper.make_tensor_value_info(target, output_type, ["n", "m"])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 2)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text(config)


def _write_torchscript(folder: Path, config: str) -> None:
    import torch

    class Echo(torch.nn.Module):
        def forward(self, text: list[str]) -> list[str]:
            return list(text)

    (folder / "1").mkdir(parents=True)
    torch.jit.save(torch.jit.script(Echo()), str(folder / "1" / "model.pt"))
    (folder / "config.pbtxt").write_text(config)
