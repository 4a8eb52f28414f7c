"""Triton lets go of a request's shared-memory regions just after it answers: an unregister that comes first is
refused "currently in use". The gateway tries again for a moment instead of leaving the region registered in Triton
for good. Triton's client is a stand-in here: the refusal is a race a real Triton shows only now and then."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from tritonclient.utils import InferenceServerException

from services.gateway.backends.triton import shared_memory
from services.gateway.backends.triton.shared_memory import TritonSharedMemory
from services.gateway.settings import Settings
from services.gateway.tensors.shared_memory import Region


class HeldForAWhile:
    """Answers an unregister "currently in use" ``refusals`` times, then lets the region go."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.registered: dict[str, str] = {}
        self.unregisters = 0

    async def register_system_shared_memory(self, name: str, key: str, byte_size: int, **_: Any) -> None:
        self.registered[name] = key

    async def unregister_system_shared_memory(self, name: str = "", **_: Any) -> None:
        self.unregisters += 1
        if self.refusals:
            self.refusals -= 1
            raise InferenceServerException(f"Cannot unregister shared memory region '{name}', it is currently in use.")
        del self.registered[name]


def region() -> Region:
    return Region("scores", "/switchyard-test-release", 0, 64, "anonymous", -1, 64)


@pytest.mark.parametrize(("refusals", "released"), [(2, True), (100, False)])
async def test_a_region_triton_still_holds_is_unregistered_once_it_lets_go(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, refusals: int, released: bool
) -> None:
    monkeypatch.setattr(shared_memory, "IN_USE_RETRIES_S", (0.001,) * len(shared_memory.IN_USE_RETRIES_S))
    client = HeldForAWhile(refusals)
    mirror = TritonSharedMemory(Settings(repository=tmp_path), lambda: client)
    held = region()
    await mirror.register(held)
    assert list(client.registered.values()) == ["/switchyard-test-release"]

    with caplog.at_level(logging.WARNING):
        await mirror.unregister(held)

    assert (client.registered == {}) is released
    if released:
        assert client.unregisters == 3
        assert "kept shared memory region" not in caplog.text
    else:  # tries a while (~2 s), then says so
        assert client.unregisters == 7
        assert "currently in use" in caplog.text
