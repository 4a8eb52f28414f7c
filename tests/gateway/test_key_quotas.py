"""A key's own limits from the keys file: ``rps`` / ``burst`` give it a bucket of its own (its tenant's other keys
are not limited by it) and ``concurrency`` caps its requests in flight across its models, on both protocols, with a
429 naming the key and its limit. Refusals for a key's sake are counted by key id and reason."""

from __future__ import annotations

import asyncio
import time
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import grpc
import numpy as np
import pytest
from app_clients import Clients, both_protocols
from prometheus_client import CollectorRegistry
from scripted_backend import ScriptedBackend
from tritonclient.grpc import service_pb2

from services.gateway.settings import Settings
from services.gateway.shaping import shaper as shaper_module
from services.gateway.shaping.keys import VERIFICATIONS_PER_S, ApiKeys
from services.keyfile.format import KeyEntry, hash_secret, presented_key
from services.keyfile.writing import write_entries

BODY = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
CAPPED = presented_key("capped", "secret-of-capped")
PACED = presented_key("paced", "secret-of-paced")
FREE = presented_key("free", "secret-of-free")


def keys_file(tmp_path: Path, *, concurrency: int = 2) -> Path:
    path = tmp_path / "keys.toml"
    write_entries(path, {
        "capped": KeyEntry("capped", (hash_secret("secret-of-capped"),), ("*",), None, "acme", concurrency=concurrency),
        "paced": KeyEntry("paced", (hash_secret("secret-of-paced"),), ("*",), None, "acme", rps=0.5, burst=2),
        "free": KeyEntry("free", (hash_secret("secret-of-free"),), ("*",), None, "acme"),
    })
    return path


def gateway(
    backend: ScriptedBackend, registry: CollectorRegistry, settings: Settings, path: Path
) -> AbstractAsyncContextManager[Clients]:
    return both_protocols(backend, settings, registry, api_keys_file=path)


def grpc_request() -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="double")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(np.arange(4, dtype=np.float32).tobytes())
    return request


def rejected(registry: CollectorRegistry, key: str, reason: str) -> float:
    return registry.get_sample_value("switchyard_api_key_rejected_total", {"key": key, "reason": reason}) or 0.0


async def test_concurrency_caps_a_keys_requests_in_flight_on_both_protocols(
    backend: ScriptedBackend, registry: CollectorRegistry, settings: Settings, tmp_path: Path
) -> None:
    async with gateway(backend, registry, settings, keys_file(tmp_path)) as (http, stub):
        backend.hold, backend.calls[:] = asyncio.Event(), []  # after the start's warm-up
        held = [asyncio.create_task(http.post("/v2/models/double/infer", json=BODY, headers={"x-api-key": CAPPED}))
                for _ in range(2)]
        while len(backend.calls) < 2:
            await asyncio.sleep(0.01)
        over = await http.post("/v2/models/double/infer", json=BODY, headers={"x-api-key": CAPPED})
        with pytest.raises(grpc.aio.AioRpcError) as over_grpc:
            await stub.ModelInfer(grpc_request(), metadata=(("x-api-key", CAPPED),))
        other_key = asyncio.create_task(http.post("/v2/models/double/infer", json=BODY, headers={"x-api-key": FREE}))
        while len(backend.calls) < 3:
            await asyncio.sleep(0.01)
        backend.hold.set()
        answers = [await task for task in (*held, other_key)]
        after = await http.post("/v2/models/double/infer", json=BODY, headers={"x-api-key": CAPPED})
        metrics = (await http.get("/metrics")).text

    assert [answer.status_code for answer in answers] == [200, 200, 200]
    assert over.status_code == 429
    assert over.json()["error"] == (
        "API key 'capped' has 2 requests in flight, its limit is 2 (its 'concurrency' in the keys file); send the "
        "next one when an answer arrives"
    )
    assert over.headers["retry-after"] == "1"
    assert over_grpc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "'capped'" in (over_grpc.value.details() or "")
    assert after.status_code == 200, "every slot came back"
    assert rejected(registry, "capped", "key_concurrency") == 2
    assert 'reason="key_concurrency"' in metrics
    assert "secret-of-capped" not in metrics


async def test_a_keys_own_rate_is_its_own_bucket(
    backend: ScriptedBackend, registry: CollectorRegistry, settings: Settings, tmp_path: Path
) -> None:
    async with gateway(backend, registry, settings, keys_file(tmp_path)) as (http, _):
        paced = [await http.post("/v2/models/double/infer", json=BODY, headers={"x-api-key": PACED}) for _ in range(3)]
        same_tenant = [await http.post("/v2/models/double/infer", json=BODY, headers={"x-api-key": FREE})
                       for _ in range(5)]
        wrong_secret = await http.post("/v2/models/double/infer", json=BODY,
                                       headers={"x-api-key": presented_key("paced", "guess")})

    assert [answer.status_code for answer in paced] == [200, 200, 429]
    assert paced[0].headers["x-ratelimit-limit"] == "2"
    assert "API key 'paced'" in paced[2].json()["error"]
    assert [answer.status_code for answer in same_tenant] == [200] * 5  # the tenant itself has no limit
    assert "x-ratelimit-limit" not in same_tenant[0].headers
    assert wrong_secret.status_code == 401
    assert rejected(registry, "paced", "rate_limit") == 1
    assert rejected(registry, "paced", "unauthorized") == 1


async def test_a_changed_concurrency_is_in_force_after_the_reload(
    backend: ScriptedBackend, registry: CollectorRegistry, settings: Settings, tmp_path: Path
) -> None:
    path = keys_file(tmp_path, concurrency=1)
    async with gateway(backend, registry, settings, path) as (http, _):
        backend.hold, backend.calls[:] = asyncio.Event(), []
        first = asyncio.create_task(http.post("/v2/models/double/infer", json=BODY, headers={"x-api-key": CAPPED}))
        while len(backend.calls) < 1:
            await asyncio.sleep(0.01)
        refused = await http.post("/v2/models/double/infer", json=BODY, headers={"x-api-key": CAPPED})
        keys_file(tmp_path, concurrency=2)
        await asyncio.sleep(1.1)  # the file is looked at once a second
        second = asyncio.create_task(http.post("/v2/models/double/infer", json=BODY, headers={"x-api-key": CAPPED}))
        while len(backend.calls) < 2:
            await asyncio.sleep(0.01)
        backend.hold.set()
        answers = [(await task).status_code for task in (first, second)]

    assert refused.status_code == 429
    assert answers == [200, 200]


async def test_a_flood_of_made_up_secrets_is_counted_as_key_flood_not_against_the_key_it_names(
    backend: ScriptedBackend, registry: CollectorRegistry, settings: Settings, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past the hashes a second the gateway spends on new secrets, the rest get 429 without a hash: the key's own
    rate limit did not refuse them, and its id is whatever the sender wrote, so neither is charged with them."""
    # The keys' clock stands still: the verification bucket does not refill however slowly the requests run.
    frozen = time.monotonic()
    monkeypatch.setattr(shaper_module, "build_api_keys",
                        lambda s: ApiKeys(s.api_keys, s.api_keys_file, clock=lambda: frozen))
    async with gateway(backend, registry, settings, keys_file(tmp_path)) as (http, _):
        answers = [
            await http.post("/v2/models/double/infer", json=BODY,
                            headers={"x-api-key": presented_key("free", f"made-up-{n}")})
            for n in range(VERIFICATIONS_PER_S + 5)
        ]  # fmt: skip

    flooded = [answer for answer in answers if answer.status_code == 429]
    assert len(flooded) == 5
    assert {answer.status_code for answer in answers} == {401, 429}
    assert flooded[0].json()["error"].startswith("too many new API keys to verify at once")
    assert registry.get_sample_value("switchyard_rejected_total", {"model": "double", "reason": "key_flood"}) == len(
        flooded
    )
    assert rejected(registry, "free", "rate_limit") == rejected(registry, "free", "key_flood") == 0
    assert rejected(registry, "free", "unauthorized") == len(answers) - len(flooded)
