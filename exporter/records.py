"""What a version folder holds beside its model file: the sample inputs and eager outputs, and the
manifest (tensors, file hashes, toolchain, parity) the gateway reads when present."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from platform import python_version
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime
import torch

from exporter.dtypes import as_numpy
from exporter.module_io import PreparedModel
from exporter.parity import ParityReport
from exporter.repository import sha256_files
from exporter.specs import ExportOptions, TensorSpec
from services.modelrepo.layout import MANIFEST_FILE, SAMPLE_INPUTS_FILE, SAMPLE_OUTPUTS_FILE, SAMPLES_DIR
from services.modelrepo.manifest import Manifest, TensorEntry


def write_samples(
    version_dir: Path, prepared: PreparedModel, served_in: tuple[str, ...], served_out: tuple[str, ...]
) -> None:
    (version_dir / SAMPLES_DIR).mkdir()
    # BF16 tensors are saved as float32 (numpy has no bfloat16), value for value; the manifest keeps the datatype.
    # In the shapes clients send and get: a (batch,) tensor is served as (batch, 1) (``model_config.served_dims``).
    inputs = {n: _served(as_numpy(t), prepared.batched) for n, t in zip(served_in, prepared.examples, strict=True)}
    outputs = {n: _served(as_numpy(t), prepared.batched)
               for n, t in zip(served_out, prepared.reference_outputs, strict=True)}
    np.savez(version_dir / SAMPLE_INPUTS_FILE, **inputs)  # type: ignore[arg-type]
    np.savez(version_dir / SAMPLE_OUTPUTS_FILE, **outputs)  # type: ignore[arg-type]


def _served(array: npt.NDArray[Any], batched: bool) -> npt.NDArray[Any]:
    """Without a batch dim a tensor is served whole, as it is (``module_io`` refuses scalars there)."""
    return array.reshape(array.shape[0], 1) if batched and array.ndim == 1 else array


def write_manifest(
    version_dir: Path,
    options: ExportOptions,
    version: int,
    *,
    released: bool,
    platform: str,
    artifact: str,
    exporter: str,
    opset: str,
    prepared: PreparedModel,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    parity: ParityReport,
    notes: Sequence[str],
) -> None:
    """Write the manifest last: its hashes cover every other file of the version folder."""
    manifest = Manifest(
        name=options.name, version=version, format=options.format, platform=platform,
        artifact=artifact, exporter=exporter, max_batch_size=options.max_batch_size,
        inputs=[_entry(s, src) for s, src in zip(inputs, prepared.input_names, strict=True)],
        outputs=[_entry(s, src) for s, src in zip(outputs, prepared.output_names, strict=True)],
        files=sha256_files(version_dir), toolchain=_toolchain(opset), parity=parity.as_dict(),
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), notes=list(notes), released=released,
    )
    (version_dir / MANIFEST_FILE).write_text(manifest.to_json())


def _entry(spec: TensorSpec, source: str) -> TensorEntry:
    return TensorEntry(name=spec.name, datatype=spec.datatype, dims=list(spec.dims), source=source)


def _toolchain(opset: str) -> dict[str, str]:
    return {
        "python": python_version(),
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "opset": opset,
    }
