"""Whether a model's run time can depend on the values it is given, not only on their shapes.

The embedded backend runs a batch on the event loop's thread when the batch is expected to be quick, and the
expectation is fitted to past runs of the same shapes. A model with data-dependent control flow (a loop whose count is
an input, a branch, an op whose output size follows the data) can take a thousand times longer on the next request
than on every one before it, with the same shapes; run inline, that one request would stall every other for as long.
Such models always run on their worker threads.

ONNX graphs are read with protobuf's unknown-field API (the gateway installs protobuf, not the ``onnx`` package): the
model's graph is field 7 of ``ModelProto``, its nodes field 1 of ``GraphProto``, a node's op type field 4 of
``NodeProto``. Ops inside a subgraph need no look: a subgraph belongs to a ``Loop``, ``If`` or ``Scan`` node of the main
graph."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf import empty_pb2
from google.protobuf.unknown_fields import UnknownFieldSet

ONNX_DATA_DEPENDENT_OPS = frozenset({"Loop", "If", "NonZero", "NonMaxSuppression", "Unique", "Compress"})
"""Ops whose work follows input values: control flow, and outputs sized by the data (every op after them too)."""

TORCHSCRIPT_DATA_DEPENDENT_KINDS = frozenset(
    {"prim::Loop", "prim::If", "aten::nonzero", "aten::nonzero_numpy", "aten::unique", "aten::_unique2"}
)
"""The same for a TorchScript graph (a traced module has no ``prim::If``: tracing keeps the branch it took)."""

_MODEL_GRAPH = 7
_GRAPH_NODE = 1
_NODE_OP_TYPE = 4


def onnx_data_dependent_ops(path: Path) -> set[str]:
    """The main graph's ops (of ``ONNX_DATA_DEPENDENT_OPS``) that make an ONNX model's run time follow its data."""
    found: set[str] = set()
    for graph in _fields(path.read_bytes(), _MODEL_GRAPH):
        for node in _fields(graph, _GRAPH_NODE):
            found.update(op.decode() for op in _fields(node, _NODE_OP_TYPE) if op.decode() in ONNX_DATA_DEPENDENT_OPS)
    return found


def torchscript_data_dependent_kinds(module: Any) -> set[str]:
    """The node kinds (of ``TORCHSCRIPT_DATA_DEPENDENT_KINDS``) in a loaded TorchScript module's inlined graph."""
    return {node.kind() for node in module.inlined_graph.nodes() if node.kind() in TORCHSCRIPT_DATA_DEPENDENT_KINDS}


def _fields(message: bytes, number: int) -> list[bytes]:
    """The length-delimited fields numbered ``number`` of a serialized message, unparsed."""
    parsed = empty_pb2.Empty()
    parsed.ParseFromString(message)
    fields = UnknownFieldSet(parsed)
    return [field.data for field in (fields[i] for i in range(len(fields))) if field.field_number == number]
