"""The classification extension: an output asked for with ``class_count`` k answers its top k entries as strings
``score:index`` or ``score:index:label`` (labels from the config's ``label_filename``), per batch row.

The wording follows Triton's: a score is printed as C's ``std::to_string`` prints it (``%f`` for floats, plain digits
for integers), the highest scores first, and a type without an order Triton accepts is refused with Triton's text.
Ties keep the lower index first (Triton's sort leaves their order unspecified)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from services.gateway.errors import InferenceFailed, InvalidInput
from services.gateway.tensors.bytes_codec import BYTES
from services.gateway.tensors.types import Array, InferOutput, ModelMetadata

CLASSIFICATION = "classification"
"""The output parameter that asks for it (tritonclient's ``class_count``), in HTTP JSON and gRPC alike."""
RANKED = frozenset({"INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64", "FP32", "FP64"})
"""The datatypes Triton classifies; BOOL, BYTES, FP16 and BF16 it refuses."""
MAX_ELEMENTS = 1_000_000
"""Entries per row past which a ranking is refused: sorting them per request would stall the event loop."""

Labels = Mapping[str, Sequence[str]]
"""Output name -> its labels, index by index."""


def check_classifiable(name: str, datatype: str) -> None:
    """Refuse, before the model runs, a class count on an output whose type has no order Triton ranks."""
    if datatype not in RANKED:
        raise InvalidInput(
            f"class result not available for output due to unsupported type '{datatype}': output '{name}' "
            f"cannot be ranked; classification takes {', '.join(sorted(RANKED))} outputs"
        )


def classify(output: InferOutput, count: int, labels: Sequence[str], batched: bool) -> InferOutput:
    """``output`` as its top ``count`` classes: shape ``[rows, k]`` when the model batches, else ``[k]``."""
    check_classifiable(output.name, output.datatype)
    data = output.data
    rows = int(data.shape[0]) if batched and data.ndim else 1
    flat = data.reshape(rows, -1) if rows else data.reshape(0, 0)
    entries = flat.shape[1]
    if entries > MAX_ELEMENTS:
        raise InvalidInput(
            f"output '{output.name}' has {entries} entries per row, more than the {MAX_ELEMENTS} classification "
            "ranks; ask for the raw output instead"
        )
    k = min(count, entries)
    floating = data.dtype.kind == "f"
    # A stable sort of keys that fall as the scores rise: highest first, ties in index order. For integers the
    # bitwise complement (-v - 1, or max - v when unsigned) does it without the overflow negation has at the edges.
    keys = -flat if floating else ~flat
    classes = np.empty((rows, k), dtype=object)
    for row in range(rows):
        order = np.argsort(keys[row], kind="stable")[:k]
        values = flat[row]
        for column, index in enumerate(order.tolist()):
            score = f"{float(values[index]):f}" if floating else str(int(values[index]))
            label = labels[index] if index < len(labels) else ""
            text = f"{score}:{index}:{label}" if label else f"{score}:{index}"
            classes[row, column] = text.encode()
    shaped: Array = classes if batched else classes.reshape(k)
    return InferOutput(output.name, BYTES, shaped)


def read_labels(model_dir: Path, config: mc.ModelConfig) -> dict[str, list[str]]:
    """Each output's labels from its ``label_filename`` in the model's folder, one label per line (Triton's
    format). Blocking (reads files). A file that cannot be read is the model's fault (a 500 whose cause, naming the
    path, goes to the log)."""
    found: dict[str, list[str]] = {}
    for output in config.output:
        if not output.label_filename:
            continue
        path = model_dir / output.label_filename
        # A config can come from a client (a repository load's override): its labels must not read files elsewhere.
        if not path.resolve().is_relative_to(model_dir.resolve()):
            raise InferenceFailed(
                f"output '{output.name}' of model '{config.name}': label_filename {output.label_filename!r} "
                "lies outside the model's folder"
            )
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InferenceFailed(
                f"output '{output.name}' of model '{config.name}': cannot read its label_filename {path}: {exc}"
            ) from None
        found[output.name] = text.splitlines()
    return found


def check_classes(classification: Mapping[str, int], metadata: ModelMetadata) -> None:
    """Refuse, before the model runs, a class count on an output whose type cannot be ranked."""
    for spec in metadata.outputs:
        if spec.name in classification:
            check_classifiable(spec.name, spec.datatype)


class LabelsCache:
    """Each loaded version's labels (``label_filename`` per output), read once per loaded config."""

    def __init__(self) -> None:
        self._read: dict[tuple[str, int], tuple[mc.ModelConfig, Labels]] = {}

    async def of(self, model: str, version: int, config: mc.ModelConfig, model_dir: Path) -> Labels:
        cached = self._read.get((model, version))
        if cached is not None and cached[0] is config:
            return cached[1]
        labels = await asyncio.to_thread(read_labels, model_dir, config)
        self._read[(model, version)] = (config, labels)
        return labels
