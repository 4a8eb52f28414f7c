"""A real tritonserver serving exporter output through the python backend: HTTP, gRPC, versions, batching."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from services.tritonlocal import LocalTriton, TritonInstall, TritonStartError
from tests.tritonlocal.support import Array, Reference, sample

pytestmark = pytest.mark.slow  # a local Triton

VERSIONED = [(model, version) for model in ("classifier", "mlp") for version in (1, 2)]


def http_infer(server: LocalTriton, model: str, version: int, inputs: dict[str, Array]) -> dict[str, Array]:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        tensors = []
        for name, array in inputs.items():
            tensor = httpclient.InferInput(name, list(array.shape), "FP32")
            tensor.set_data_from_numpy(array, binary_data=True)
            tensors.append(tensor)
        result = client.infer(model, tensors, model_version=str(version))
        return {o["name"]: result.as_numpy(o["name"]) for o in result.get_response()["outputs"]}
    finally:
        client.close()


def grpc_inputs(inputs: dict[str, Array]) -> list[Any]:
    tensors = []
    for name, array in inputs.items():
        tensor = grpcclient.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


def grpc_infer(server: LocalTriton, model: str, version: int, inputs: dict[str, Array]) -> dict[str, Array]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        result = client.infer(model, grpc_inputs(inputs), model_version=str(version))
        return {o.name: result.as_numpy(o.name) for o in result.get_response().outputs}
    finally:
        client.close()


def assert_outputs_equal(got: dict[str, Array], expected: dict[str, Array]) -> None:
    assert set(got) == set(expected)
    for name, array in expected.items():
        np.testing.assert_allclose(got[name], array, rtol=1e-5, atol=1e-6, err_msg=name)


def test_every_version_is_ready_when_models_are_loaded_over_grpc(triton: LocalTriton) -> None:
    assert triton.ready()
    assert triton.model_states("classifier") == {1: "READY", 2: "READY"}
    assert triton.model_states("mlp") == {1: "READY", 2: "READY"}
    assert triton.model_states("mlp_ts") == {1: "READY"}


@pytest.mark.parametrize(("model", "version"), VERSIONED)
def test_http_infer_matches_onnxruntime_when_a_version_is_pinned(
    triton: LocalTriton, reference: Reference, model: str, version: int
) -> None:
    inputs = sample(model, rows=3, seed=version)
    assert_outputs_equal(http_infer(triton, model, version, inputs), reference(model, version, inputs))


@pytest.mark.parametrize(("model", "version"), VERSIONED)
def test_grpc_infer_matches_onnxruntime_when_a_version_is_pinned(
    triton: LocalTriton, reference: Reference, model: str, version: int
) -> None:
    inputs = sample(model, rows=5, seed=10 + version)
    assert_outputs_equal(grpc_infer(triton, model, version, inputs), reference(model, version, inputs))


@pytest.mark.parametrize("model", ["classifier", "mlp"])
def test_versions_answer_differently_when_given_the_same_input(triton: LocalTriton, model: str) -> None:
    inputs = sample(model, rows=2)
    first, second = (grpc_infer(triton, model, v, inputs) for v in (1, 2))
    for name in first:
        assert not np.allclose(first[name], second[name]), name


def test_torchscript_export_is_served_when_the_artifact_is_model_pt(triton: LocalTriton, repository: Path) -> None:
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    try:
        metadata = client.get_model_metadata("mlp_ts", "1", as_json=True)
    finally:
        client.close()
    input_name = metadata["inputs"][0]["name"]
    features = sample("mlp", rows=4)["features"]
    got = grpc_infer(triton, "mlp_ts", 1, {input_name: features})
    module = torch.jit.load(str(repository / "mlp_ts" / "1" / "model.pt"))  # type: ignore[no-untyped-call]
    with torch.inference_mode():
        expected = [t.numpy() for t in module(torch.from_numpy(features))]
    output_names = [o["name"] for o in metadata["outputs"]]
    assert_outputs_equal(got, dict(zip(output_names, expected, strict=True)))


async def test_dynamic_batching_groups_requests_when_32_clients_send_at_once(
    triton: LocalTriton, reference: Reference
) -> None:
    client = grpcaio.InferenceServerClient(triton.grpc_url)
    try:
        before = await _counts(client, "mlp", 1)
        # Uneven row counts check that each caller gets its own rows back out of the shared batch.
        inputs = [sample("mlp", rows=1 + i % 3, seed=100 + i) for i in range(32)]
        results = await asyncio.gather(
            *(client.infer("mlp", grpc_inputs(x), model_version="1") for x in inputs)
        )
        rows = sum(x["features"].shape[0] for x in inputs)
        after = await _counts(client, "mlp", 1, at_least=before["inference_count"] + rows)
    finally:
        await client.close()
    for x, result in zip(inputs, results, strict=True):
        got = {name: result.as_numpy(name) for name in ("logits", "probabilities")}
        assert_outputs_equal(got, reference("mlp", 1, x))
    inferences, executions = (after[k] - before[k] for k in ("inference_count", "execution_count"))
    assert inferences == sum(x["features"].shape[0] for x in inputs)
    assert executions < 32, f"{executions} executions for 32 concurrent requests: no dynamic batching"


async def test_a_bad_request_fails_alone_when_sent_among_good_ones(triton: LocalTriton, reference: Reference) -> None:
    client = grpcaio.InferenceServerClient(triton.grpc_url)
    good = [sample("mlp", rows=1, seed=200 + i) for i in range(15)]
    bad = {"features": np.zeros((1, 31), dtype=np.float32)}
    try:
        results = await asyncio.gather(
            *(client.infer("mlp", grpc_inputs(x), model_version="2") for x in [*good, bad]),
            return_exceptions=True,
        )
    finally:
        await client.close()
    assert isinstance(results[-1], InferenceServerException)
    assert "features" in str(results[-1])
    for x, result in zip(good, results[:-1], strict=True):
        assert not isinstance(result, BaseException), result
        assert_outputs_equal({"logits": result.as_numpy("logits")}, {"logits": reference("mlp", 2, x)["logits"]})


def test_load_serves_only_the_pinned_versions_when_a_specific_policy_is_sent(triton: LocalTriton) -> None:
    inputs = sample("mlp", rows=1)
    try:
        triton.load("mlp", [2])
        assert triton.model_states("mlp") == {1: "UNAVAILABLE", 2: "READY"}
        grpc_infer(triton, "mlp", 2, inputs)
        with pytest.raises(InferenceServerException, match="not at ready state"):
            grpc_infer(triton, "mlp", 1, inputs)
    finally:
        triton.load("mlp")
    assert triton.model_states("mlp") == {1: "READY", 2: "READY"}


def test_unload_returns_when_no_version_is_left_serving(triton: LocalTriton) -> None:
    try:
        triton.unload("classifier")
        assert set(triton.model_states("classifier").values()) == {"UNAVAILABLE"}
    finally:
        triton.load("classifier")
    assert triton.model_states("classifier") == {1: "READY", 2: "READY"}


async def _counts(client: Any, model: str, version: int, *, at_least: int = 0) -> dict[str, int]:
    """inference_count and execution_count; Triton counts a batch just after answering it, so wait (up to
    2 s) until inference_count reaches ``at_least``."""
    deadline = time.monotonic() + 2.0
    while True:
        stats = await client.get_inference_statistics(model, str(version), as_json=True)
        entry = stats["model_stats"][0]
        counts = {key: int(entry.get(key, 0)) for key in ("inference_count", "execution_count")}
        if counts["inference_count"] >= at_least or time.monotonic() > deadline:
            return counts
        await asyncio.sleep(0.02)


def test_start_refuses_when_a_port_is_taken_by_another_server(triton: LocalTriton, tmp_path: Path) -> None:
    second = LocalTriton(triton.source, http_port=triton.ports.http, derived=tmp_path / "derived",
                         install=triton.install)
    with pytest.raises(TritonStartError, match=f"HTTP port {triton.ports.http} .* in use"):
        second.start()
    assert second.pid is None
    assert triton.ready()


@pytest.mark.parametrize(
    ("ports", "expected"),
    [
        ({"http_port": 70000}, "HTTP port 70000 is not a port number: expected 0-65535"),
        ({"metrics_port": -1}, "metrics port -1 is not a port number"),
        ({"http_port": 9931, "grpc_port": 9931}, "HTTP and gRPC are both given port 9931: each listener needs its own"),
    ],
)
def test_start_refuses_ports_no_listener_can_have(
    install: TritonInstall, repository: Path, tmp_path: Path, ports: dict[str, int], expected: str
) -> None:
    """Named before anything starts, as one error line: not Python's OverflowError from bind, nor tritonserver's exit
    after it wrote the refusal into its log."""
    server = LocalTriton(repository, derived=tmp_path / "derived", install=install, **ports)
    with pytest.raises(TritonStartError, match=expected):
        server.start()
    assert server.pid is None

