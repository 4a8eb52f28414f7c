"""What a model repository looks like on disk. The one place these rules live.

::

    <repository>/<model>/config.pbtxt         Triton ModelConfig (protobuf text), shared by every version
    <repository>/<model>/warmup/<file>        raw sample data named by the config's model_warmup
    <repository>/<model>/<version>/<file>     the model file: default_model_filename, else Triton's default
    <repository>/<model>/<version>/manifest.json, samples/   written by the exporter; optional for serving
    <repository>/.switchyard.lock             publishers take it (flock) while they change the repository
    <repository>/.staging-<pid>-*             an export being assembled: never a model
    <repository>/.export-logs/<model>-*.log   the exporters' diagnostics of failed exports (the newest few)
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

CONFIG_FILE = "config.pbtxt"
WARMUP_DIR = "warmup"
MANIFEST_FILE = "manifest.json"
SAMPLES_DIR = "samples"
SAMPLE_INPUTS_FILE = f"{SAMPLES_DIR}/inputs.npz"
SAMPLE_OUTPUTS_FILE = f"{SAMPLES_DIR}/outputs.npz"
LOCK_FILE = ".switchyard.lock"
STAGING_PREFIX = ".staging-"
EXPORT_LOGS_DIR = ".export-logs"

ONNX_PLATFORM = "onnxruntime_onnx"
TORCHSCRIPT_PLATFORM = "pytorch_libtorch"

# Triton's model file name per platform and per backend, when the config has no default_model_filename.
_PLATFORM_FILES = {
    ONNX_PLATFORM: "model.onnx",
    TORCHSCRIPT_PLATFORM: "model.pt",
    "tensorrt_plan": "model.plan",
    "tensorflow_graphdef": "model.graphdef",
    "tensorflow_savedmodel": "model.savedmodel",
}
_BACKEND_FILES = {
    "onnxruntime": "model.onnx",
    "pytorch": "model.pt",
    "tensorrt": "model.plan",
    "openvino": "model.xml",
    "python": "model.py",
    "dali": "model.dali",
}
_BACKEND_PLATFORMS = {"onnxruntime": ONNX_PLATFORM, "pytorch": TORCHSCRIPT_PLATFORM}


def platform(config: mc.ModelConfig) -> str:
    """The config's platform, or the one its ``backend`` implies for ONNX and TorchScript, else the backend."""
    return str(config.platform or _BACKEND_PLATFORMS.get(config.backend, config.backend))


def model_filename(config: mc.ModelConfig) -> str | None:
    """The file each version folder must hold; ``None`` for models without one (ensembles, unknown backends)."""
    if config.default_model_filename:
        return str(config.default_model_filename)
    if config.platform:
        return _PLATFORM_FILES.get(config.platform)
    return _BACKEND_FILES.get(config.backend)


def is_model_dir(path: Path) -> bool:
    """A folder with a ``config.pbtxt`` and a visible name (hidden ones are staging areas or tool state)."""
    return path.is_dir() and not path.name.startswith(".") and (path / CONFIG_FILE).is_file()


def model_dirs(repository: Path) -> list[Path]:
    return sorted(path for path in repository.iterdir() if is_model_dir(path))


def is_version_name(name: str) -> bool:
    """A version folder's name: ASCII digits from 1 up, no leading zero. Triton skips a folder named ``01`` or
    ``abc`` with a warning, and ``str.isdigit`` alone would let ``²`` through to ``int()``, which refuses it; a
    folder ``0`` is skipped too (version numbers start at 1 here: Triton would load it)."""
    return name.isascii() and name.isdigit() and name[0] != "0"


def is_version_dir(path: Path, config: mc.ModelConfig) -> bool:
    """A folder named by a version number holding the model file the config names (a file, or a folder such as an
    ONNX model with external data or a SavedModel)."""
    if not (is_version_name(path.name) and path.is_dir()):
        return False
    filename = model_filename(config)
    return filename is None or (path / filename).exists()


def versions(model_dir: Path, config: mc.ModelConfig) -> tuple[int, ...]:
    """The model's version numbers on disk, ascending."""
    return tuple(sorted(int(path.name) for path in model_dir.iterdir() if is_version_dir(path, config)))


def model_path(model_dir: Path, version: int, config: mc.ModelConfig) -> Path | None:
    filename = model_filename(config)
    return None if filename is None else model_dir / str(version) / filename


def has_manifest(version_dir: Path) -> bool:
    return (version_dir / MANIFEST_FILE).is_file()


@contextlib.contextmanager
def publish_lock(repository: Path) -> Iterator[None]:
    """Serialise publishers of one repository (several exports, a gateway rescanning) with an advisory lock."""
    with locked_file(repository / LOCK_FILE):
        yield


@contextlib.contextmanager
def locked_file(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created if missing) for the duration of the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
