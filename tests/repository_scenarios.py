"""What the model-repository extension must do, written once and run against each tritonclient flavour and each
backend: unload then load back, and a load whose config override narrows the version policy."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from tests.repository_clients import RepositoryClient, policy, states, status

Inputs = dict[str, np.ndarray[Any, Any]]


def all_ready(versions: tuple[int, ...]) -> dict[str, tuple[str, str]]:
    return {str(v): ("READY", "") for v in versions}


async def unload_then_load_back(
    client: RepositoryClient, model: str, inputs: Inputs, versions: tuple[int, ...]
) -> None:
    """Every version listed UNAVAILABLE (reason: unloaded) and unversioned requests refused 404 / NOT_FOUND as
    Triton refuses them for an unloaded model; a load brings every version back and routes the highest."""
    assert states(await client.index(), model) == all_ready(versions)
    await client.unload(model)
    unloaded = states(await client.index(), model)
    assert set(unloaded) == {str(v) for v in versions}
    for state, reason in unloaded.values():
        assert state == "UNAVAILABLE"
        assert "unloaded" in reason
    with pytest.raises(InferenceServerException) as refused:
        await client.infer(model, inputs)
    assert status(refused.value) in ("404", "NOT_FOUND")
    assert str(refused.value.message()).startswith(f"Request for unknown model: '{model}' has no available versions")
    await client.unload(model)  # already unloaded: nothing to do, as in Triton
    await client.load(model)
    assert states(await client.index(), model) == all_ready(versions)
    assert await client.infer(model, inputs) == max(versions)


async def narrow_then_widen(client: RepositoryClient, model: str, inputs: Inputs) -> None:
    """``specific [1]`` serves version 1 alone (version 2 drained and unloaded); a plain load re-reads config.pbtxt
    (policy ``all``) and serves both again, routing version 2."""
    await client.load(model, policy(1))
    narrowed = states(await client.index(), model)
    assert narrowed["1"] == ("READY", "")
    assert narrowed["2"][0] == "UNAVAILABLE"
    assert await client.infer(model, inputs) == 1
    await client.load(model)
    assert states(await client.index(), model) == all_ready((1, 2))
    assert await client.infer(model, inputs) == 2
