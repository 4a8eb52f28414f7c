"""Helpers for tests that need the real local Triton (here and in the gateway's Triton tests)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from services.tritonlocal import TritonInstall
from tests.slow_work import slow_work

Array = npt.NDArray[Any]
# (model, version, inputs) -> outputs, computed without Triton
Reference = Callable[[str, int, dict[str, Array]], dict[str, Array]]


def require_install() -> TritonInstall:
    """The local Triton install; skips the test without one, unless ``CI`` is set, where that fails it."""
    slow_work("uses the local Triton")
    found = TritonInstall.default()
    if not found.present():
        reason = f"no local Triton under {found.home}: run `make install` (deploy/triton/install.sh)"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and {reason}", pytrace=False)
        pytest.skip(reason)
    found.check()  # present but unusable (numpy >= 2 in the stub env, ...) is an error, never a skip
    return found


def sample(model: str, rows: int, seed: int = 0) -> dict[str, Array]:
    """Random inputs for the example models (``classifier``: image [3,64,64]; ``mlp``: features [32])."""
    generator = np.random.default_rng(seed)
    if model == "classifier":
        return {"image": generator.standard_normal((rows, 3, 64, 64), dtype=np.float32)}
    return {"features": generator.standard_normal((rows, 32), dtype=np.float32)}
