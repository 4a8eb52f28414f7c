"""Optional dependencies: what each extra of the ``switchyard`` distribution brings, and the one-line error a
command gives when the extra it needs is not installed."""

from __future__ import annotations

import importlib
from importlib import metadata
from types import ModuleType

EXTRAS = {
    "export": "torch==2.13.0, onnx and onnxscript: the exporter, and TorchScript models in the embedded backend",
    "gpu": "onnxruntime-gpu: the GPU serving variant",
    "tune": "matplotlib: the Pareto plot of `switchyard tune`",
    "dev": "test and benchmark tools",
}


class MissingExtra(ImportError):
    """A feature whose extra is not installed; ``str()`` is one line naming the extra and the pip command. An
    ``ImportError``, so code that guards an optional import keeps working."""

    def __init__(self, feature: str, extra: str, module: str) -> None:
        super().__init__(
            f"{feature} needs the '{extra}' extra ({module} is not installed): pip install 'switchyard[{extra}]'",
            name=module,
        )
        self.feature = feature
        self.extra = extra
        self.module = module


def require(module: str, *, extra: str, feature: str) -> ModuleType:
    """Import ``module`` or raise ``MissingExtra`` for ``feature`` (e.g. ``"switchyard export"``)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        # A module that is installed but fails inside its own imports is a different problem: say which.
        if exc.name is not None and exc.name != module and not module.startswith(f"{exc.name}."):
            raise
        raise MissingExtra(feature, extra, module) from None


def runtime_conflict() -> str | None:
    """onnxruntime and onnxruntime-gpu install the same module: with both, whichever was installed last wins file
    by file. Says how to fix it when both distributions are present."""
    installed = set()
    for name in ("onnxruntime", "onnxruntime-gpu"):
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        installed.add(name)
    if len(installed) < 2:
        return None
    return (
        "both onnxruntime and onnxruntime-gpu are installed and overwrite each other's files; for GPU serving run "
        "`pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime-gpu`"
    )
