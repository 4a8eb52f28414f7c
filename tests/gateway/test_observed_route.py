"""The route the inference log and the traces name for an answer (``pinned``, ``stable``, ``canary``), read when the
answer goes out: by the routing's canary split, so that a request routed as stable whose version an activation
flipped away from while it ran is still named stable."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from services.gateway.app import observer
from services.gateway.metrics import GatewayMetrics
from services.gateway.settings import Settings
from services.gateway.tensors.types import InferInput, InferRequest


class Routing:
    """The router's ``record`` as the observer reads it."""

    def __init__(self, stable: int, canary: int | None = None) -> None:
        self.stable, self.canary = stable, canary

    def record(self, model: str) -> Any:
        canary = None if self.canary is None else SimpleNamespace(version=self.canary, weight=10.0)
        return SimpleNamespace(stable=self.stable, canary=canary, inference_log=None)


def request(version: int | None = None) -> InferRequest:
    return InferRequest("mlp", version, [InferInput("x", "FP32", (1, 1), np.zeros((1, 1), np.float32))])


@pytest.mark.parametrize(
    ("routing", "version", "asked", "expected"),
    [
        (Routing(stable=2), 1, None, "stable"),  # routed to stable 1, answered after the flip to 2
        (Routing(stable=2), 2, None, "stable"),
        (Routing(stable=1, canary=3), 3, None, "canary"),
        (Routing(stable=1, canary=3), 1, None, "stable"),
        (Routing(stable=3, canary=3), 3, None, "stable"),  # a canary promoted: its version is the stable one now
        (Routing(stable=2), 1, 1, "pinned"),
    ],
)
def test_route_is_named_by_the_canary_split_when_the_answer_goes_out(
    tmp_path: Path, routing: Routing, version: int, asked: int | None, expected: str
) -> None:
    settings = Settings(repository=tmp_path, inference_log=f"file://{tmp_path / 'log'}")
    watching = observer(settings, routing, object(), GatewayMetrics(CollectorRegistry()))  # type: ignore[arg-type]
    assert watching is not None
    try:
        assert watching.route(request(asked), version) == expected
    finally:
        watching.close(1.0)
