"""The per-version ``manifest.json``: what was exported, how, and how faithfully.

The exporter writes it; the gateway reads it when present (warm-up samples, expected outputs) and serves
versions without one too. Its layout is a contract:
``<repository>/<model>/<version>/manifest.json`` next to ``model.onnx`` / ``model.pt`` and the
``samples/`` folder holding ``inputs.npz`` and ``outputs.npz`` (arrays keyed by tensor name,
batch dimension first; ``outputs.npz`` is what eager PyTorch produced for ``inputs.npz``).
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from services.modelrepo.layout import MANIFEST_FILE, SAMPLE_INPUTS_FILE, SAMPLE_OUTPUTS_FILE

FORMAT_VERSION = 1


@dataclass(frozen=True)
class TensorEntry:
    """One input or output as served: Triton datatype (``FP32``) and dims without the batch dim."""

    name: str
    datatype: str
    dims: list[int]
    source: str = ""
    """The name in the PyTorch model (dict key / argument name) when it differs from the served one."""


@dataclass(frozen=True)
class Manifest:
    name: str
    version: int
    format: str
    """``onnx`` or ``torchscript``."""
    platform: str
    """Triton platform: ``onnxruntime_onnx`` or ``pytorch_libtorch``."""
    artifact: str
    """File name of the model inside the version folder (``model.onnx`` / ``model.pt``)."""
    exporter: str
    """Which exporter produced the artifact (``torch.onnx.dynamo``, ``torch.onnx.torchscript``,
    ``torch.jit.script+torch.onnx.torchscript``, ``torch.jit.script``, ``torch.jit.trace``)."""
    max_batch_size: int
    inputs: list[TensorEntry]
    outputs: list[TensorEntry]
    files: dict[str, str]
    """sha256 of every file in the version folder, keyed by path relative to it."""
    toolchain: dict[str, str]
    """Versions of python, torch, onnx, onnxruntime and the ONNX opset used."""
    parity: dict[str, Any]
    sample_inputs: str = SAMPLE_INPUTS_FILE
    sample_outputs: str = SAMPLE_OUTPUTS_FILE
    created_at: str = ""
    format_version: int = FORMAT_VERSION
    notes: list[str] = field(default_factory=list)
    released: bool = True
    """Whether a gateway with no routing state for the model may make this version stable by itself (see
    ``is_released``). The exporter sets it from ``release=`` / ``--release``; manifests without it are released."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        fields = dict(data)
        fields["inputs"] = [TensorEntry(**t) for t in data["inputs"]]
        fields["outputs"] = [TensorEntry(**t) for t in data["outputs"]]
        return cls(**fields)


def read_manifest(version_dir: Path) -> Manifest:
    """Read ``version_dir/manifest.json``; raises ``FileNotFoundError`` / ``ValueError`` if absent or bad."""
    path = version_dir / MANIFEST_FILE
    try:
        data = json.loads(path.read_text())
        return Manifest.from_dict(data)
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not a valid Switchyard manifest: {exc}") from exc


def is_released(version_dir: Path) -> bool:
    """Whether the version may become a model's stable version without anyone activating it, when a gateway starts
    with no routing state for the model. Only an exporter's explicit ``"released": false`` says no: a folder without
    a manifest was put there by hand (as for Triton, it serves), and a manifest from before the flag, or one that
    cannot be read (the loader reports that), counts as released. Blocking: call off the loop."""
    try:
        data = json.loads((version_dir / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return True
    return not (isinstance(data, dict) and data.get("released") is False)


NO_MANIFEST = "no manifest"
"""The export identity of a version folder the exporter did not write (put there by hand, as for Triton)."""


def export_identity(version_dir: Path) -> str | None:
    """Which export ``version_dir`` holds, in one line for routing records and messages: the model file's sha256 as
    the manifest recorded it, and when it was exported (``model.onnx sha256:1f2e3d4c5b6a7980 exported
    2026-12-04T10:00:00+00:00``); a new export of the same number differs by its time even when its bytes do not.

    Only the small manifest is read, never the model file: a start costs the same whatever the model's size. It
    trusts the manifest: a model file swapped by hand under an untouched manifest goes unnoticed (the manifest's own
    hashes then no longer match its files). The exporter never does that, and whoever can write the repository can
    serve anything anyway; this tells an export apart from another one, it does not defend against the operator.
    ``NO_MANIFEST`` for a folder without one (two hand-placed folders look alike: the number is trusted, as Triton
    does); a manifest without the artifact's hash is named by a hash of its own bytes; ``None`` when the manifest
    cannot be read now (nothing can be said). Blocking: call off the loop."""
    try:
        raw = (version_dir / MANIFEST_FILE).read_bytes()
    except FileNotFoundError:
        return NO_MANIFEST
    except OSError:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    artifact = data.get("artifact") if isinstance(data, dict) else None
    files = data.get("files") if isinstance(data, dict) else None
    digest = files.get(artifact) if isinstance(files, dict) and isinstance(artifact, str) else None
    if not isinstance(digest, str) or not digest:
        return f"{MANIFEST_FILE} sha256:{hashlib.sha256(raw).hexdigest()[:16]}"
    created = data.get("created_at") if isinstance(data, dict) else None
    exported = f" exported {created}" if isinstance(created, str) and created else ""
    return f"{artifact} sha256:{digest[:16]}{exported}"


def read_samples(version_dir: Path, relative: str) -> dict[str, npt.NDArray[Any]]:
    """Load a samples ``.npz`` (inputs or expected outputs) as name -> array, batch dim first. ``OSError`` when it
    cannot be read; ``ValueError`` naming the file when it is not a ``.npz`` of plain arrays."""
    path = version_dir / relative
    # The file is opened here: numpy leaves a path it opened itself open when the bytes are not what it expects.
    with path.open("rb") as handle:
        try:
            archive = np.load(handle, allow_pickle=False)
            if not isinstance(archive, np.lib.npyio.NpzFile):
                raise ValueError("it holds a single .npy array, not arrays keyed by tensor name")
            with archive:
                return {key: archive[key] for key in archive.files}
        except (ValueError, EOFError, zipfile.BadZipFile) as exc:
            # numpy reads bytes it does not recognise as a pickle, and its refusal then suggests allow_pickle=True:
            # advice that would run whatever the file holds. Say what the file should be instead.
            raise ValueError(f"{path} is not a valid .npz of arrays (numpy.savez: one array per tensor name): "
                             f"{_npz_fault(exc)}") from None


def _npz_fault(exc: Exception) -> str:
    if isinstance(exc, EOFError):
        return "the file is empty"
    if isinstance(exc, zipfile.BadZipFile):
        return f"its zip archive is damaged ({exc})"
    if "pickled" in str(exc):
        return "it is neither a zip archive of arrays nor an array"
    if "Object arrays" in str(exc):
        return "it holds arrays of Python objects, which are never unpickled"
    return str(exc)
