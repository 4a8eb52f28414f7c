"""Waiting for Triton's repository index to settle after a load: the error an operator reads when it does not. The
client is a stand-in that answers the index as a Triton would while another client keeps loading a version back."""

from __future__ import annotations

from typing import Any

import pytest

from services.modelrepo.control import ModelControl, ModelControlError


class Index:
    """``get_model_repository_index`` answering the same states every time."""

    def __init__(self, states: dict[int, str]) -> None:
        self._states = states
        self.reads = 0

    async def get_model_repository_index(self, *, as_json: bool, client_timeout: float) -> dict[str, Any]:
        self.reads += 1
        return {"models": [{"name": "mlp", "version": str(v), "state": s} for v, s in self._states.items()]}


async def test_settle_names_versions_still_served_after_the_load_that_dropped_them() -> None:
    client = Index({1: "READY", 2: "READY"})  # version 1 dropped, and loaded back by someone else each time
    with pytest.raises(ModelControlError) as raised:
        await ModelControl(client, poll_s=0.01).settle("mlp", {2}, deadline=0.0)
    assert raised.value.code == "NOT_SETTLED"
    assert str(raised.value) == (
        "model 'mlp' did not settle in Triton: {1: 'READY', 2: 'READY'}; version(s) [1] are still READY after the "
        "load that dropped them: another client of this Triton loads them back (a second gateway in front of it with "
        "a routing state of its own? gateways in front of one Triton share one state: SWITCHYARD_STATE_PATH or "
        "SWITCHYARD_REDIS_URL)"
    )


async def test_settle_reports_versions_still_moving_at_the_deadline_as_triton_said() -> None:
    client = Index({1: "UNLOADING", 2: "READY"})
    with pytest.raises(ModelControlError) as raised:
        await ModelControl(client, poll_s=0.01).settle("mlp", {2}, deadline=0.0)
    assert str(raised.value) == "model 'mlp' did not settle in Triton: {1: 'UNLOADING', 2: 'READY'}"


async def test_settle_returns_once_exactly_the_versions_asked_for_are_ready() -> None:
    client = Index({2: "READY"})
    await ModelControl(client, poll_s=0.01).settle("mlp", {2}, deadline=0.0)
    assert client.reads == 1
