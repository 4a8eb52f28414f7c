"""The classification extension against its reference: the same model and labels file served by the local Triton,
asked directly and through the gateway on both backends, over HTTP and gRPC; and the rule that a parameter the
gateway does not implement is refused, not dropped (Triton's backend forwards request parameters, the embedded one
refuses them)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import InferenceServerException

from services.gateway.settings import Settings
from services.modelrepo import layout
from services.tritonlocal import LocalTriton, TritonInstall
from tests.gateway_harness import RunningGateway, running_gateway
from tests.shared_exports import copy_examples
from tests.triton.support import gateway_settings, local_gateway, local_triton

pytestmark = pytest.mark.slow
SEQUENCED = "mlp_sequence"
LABELS = ["ant", "bee", "cat", "dog", "eel", "fox", "gnu"]  # 7 labels for 8 classes: the last one has none
ROWS = np.random.default_rng(3).standard_normal((3, 32)).astype(np.float32)


@pytest.fixture(scope="module")
def labelled_repository(example_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``mlp`` with a labels file on its ``probabilities`` output, as Triton's image classifiers have."""
    root = copy_examples(example_repository, tmp_path_factory.mktemp("labelled"), models=("mlp",))
    config_path = root / "mlp" / layout.CONFIG_FILE
    config = text_format.Parse(config_path.read_text(), mc.ModelConfig())
    for output in config.output:
        if output.name == "probabilities":
            output.label_filename = "labels.txt"
    config_path.write_text(text_format.MessageToString(config))
    (root / "mlp" / "labels.txt").write_text("\n".join(LABELS) + "\n")
    # The same model behind Triton's sequence batcher: every request must name its sequence (correlation id).
    shutil.copytree(root / "mlp", root / SEQUENCED)
    config.name = SEQUENCED
    config.sequence_batching.SetInParent()  # replaces the dynamic batcher (one scheduler per model)
    (root / SEQUENCED / layout.CONFIG_FILE).write_text(text_format.MessageToString(config))
    return root


@pytest.fixture(scope="module")
def servers(
    install: TritonInstall, labelled_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LocalTriton, RunningGateway, RunningGateway]]:
    """The reference Triton, the gateway in front of it, and an embedded gateway on the same repository."""
    with local_triton(labelled_repository, tmp_path_factory.mktemp("triton"), install) as triton:
        triton.load("mlp", [1])  # the reference, asked directly (the Triton-backend gateway loads what it routes)
        started = time.monotonic()
        with local_gateway(gateway_settings(triton.grpc_url, labelled_repository)) as through_triton:
            settings = Settings(repository=labelled_repository, port=0, grpc_port=0)
            with running_gateway(settings) as embedded:
                print(f"gateways up in {time.monotonic() - started:.1f} s")
                yield triton, through_triton, embedded


def _http(url: str, count: int) -> np.ndarray:
    with httpclient.InferenceServerClient(url) as client:
        tensor = httpclient.InferInput("features", list(ROWS.shape), "FP32")
        tensor.set_data_from_numpy(ROWS)
        outputs = [httpclient.InferRequestedOutput("probabilities", class_count=count)]
        result = client.infer("mlp", [tensor], model_version="1", outputs=outputs)
        answer = result.as_numpy("probabilities")
        assert answer is not None
        return answer


def _grpc(url: str, count: int) -> np.ndarray:
    with grpcclient.InferenceServerClient(url) as client:
        tensor = grpcclient.InferInput("features", list(ROWS.shape), "FP32")
        tensor.set_data_from_numpy(ROWS)
        outputs = [grpcclient.InferRequestedOutput("probabilities", class_count=count)]
        answer = client.infer("mlp", [tensor], model_version="1", outputs=outputs).as_numpy("probabilities")
        assert answer is not None
        return answer


@pytest.mark.parametrize("count", [3, 8, 20])
def test_class_count_answers_equal_tritons_on_both_backends_and_protocols(
    servers: tuple[LocalTriton, RunningGateway, RunningGateway], count: int
) -> None:
    triton, through_triton, embedded = servers
    reference = _grpc(triton.grpc_url, count)
    assert reference.shape == (3, min(count, 8))
    assert any(entry.count(b":") == 2 for entry in reference.ravel())  # labels were read: the case is exercised
    assert _http(triton.http_url, count).tolist() == reference.tolist()
    for gateway in (through_triton, embedded):
        assert _grpc(gateway.grpc_url, count).tolist() == reference.tolist()
        assert _http(gateway.http_url, count).tolist() == reference.tolist()


def test_classification_is_listed_among_the_extensions(
    servers: tuple[LocalTriton, RunningGateway, RunningGateway],
) -> None:
    _, through_triton, embedded = servers
    with httpclient.InferenceServerClient(embedded.http_url) as client:
        extensions = client.get_server_metadata()["extensions"]
        assert "classification" in extensions
        assert "sequence" not in extensions
    with grpcclient.InferenceServerClient(through_triton.grpc_url) as client:
        assert {"classification", "parameters", "sequence"} <= set(client.get_server_metadata().extensions)


def _refusal(call: object) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()  # type: ignore[operator]
    return caught.value


def test_request_parameters_are_forwarded_to_triton_and_refused_by_the_embedded_backend(
    servers: tuple[LocalTriton, RunningGateway, RunningGateway],
) -> None:
    _, through_triton, embedded = servers
    tensor = grpcclient.InferInput("features", list(ROWS.shape), "FP32")
    tensor.set_data_from_numpy(ROWS)
    with grpcclient.InferenceServerClient(through_triton.grpc_url) as client:
        client.infer("mlp", [tensor], model_version="1", parameters={"tag": "a", "weight": 2})
    with grpcclient.InferenceServerClient(embedded.grpc_url) as client:
        error = _refusal(lambda: client.infer("mlp", [tensor], parameters={"tag": "a"}))
        assert error.status() == "StatusCode.INVALID_ARGUMENT"
        assert "parameter 'tag' is not supported for model 'mlp': the embedded backend" in error.message()
    http_tensor = httpclient.InferInput("features", list(ROWS.shape), "FP32")
    http_tensor.set_data_from_numpy(ROWS)
    with httpclient.InferenceServerClient(embedded.http_url) as client:
        error = _refusal(lambda: client.infer("mlp", [http_tensor], parameters={"tag": "a"}))
        assert error.status() == "400"
        assert "parameter 'tag' is not supported" in error.message()


@pytest.mark.parametrize("backend", ["triton", "embedded"])
def test_sequence_parameters_are_refused_for_a_model_without_a_sequence_batcher(
    servers: tuple[LocalTriton, RunningGateway, RunningGateway], backend: str
) -> None:
    gateway = servers[1] if backend == "triton" else servers[2]
    tensor = grpcclient.InferInput("features", list(ROWS.shape), "FP32")
    tensor.set_data_from_numpy(ROWS)
    with grpcclient.InferenceServerClient(gateway.grpc_url) as client:
        error = _refusal(lambda: client.infer("mlp", [tensor], sequence_id=4, sequence_start=True))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    # tritonclient sends all three (sequence_end false): the answer names each
    text = "sequence parameter(s) 'sequence_id', 'sequence_start', 'sequence_end' not supported for model 'mlp'"
    assert text in error.message()


def test_sequence_parameters_reach_tritons_sequence_batcher_and_the_embedded_backend_refuses_them(
    servers: tuple[LocalTriton, RunningGateway, RunningGateway],
) -> None:
    _, through_triton, embedded = servers
    tensor = grpcclient.InferInput("features", [1, ROWS.shape[1]], "FP32")  # a sequence batcher takes one row
    tensor.set_data_from_numpy(ROWS[:1])
    with grpcclient.InferenceServerClient(through_triton.grpc_url) as client:
        plain = client.infer("mlp", [tensor], model_version="1").as_numpy("logits")
        answer = client.infer(SEQUENCED, [tensor], model_version="1", sequence_id=7, sequence_start=True,
                              sequence_end=True)
        assert np.array_equal(answer.as_numpy("logits"), plain)
        # Triton's sequence batcher, not the gateway, refuses a request that names no sequence: the id got through
        error = _refusal(lambda: client.infer(SEQUENCED, [tensor], model_version="1"))
        assert "correlation ID" in error.message()
    with grpcclient.InferenceServerClient(embedded.grpc_url) as client:
        error = _refusal(lambda: client.infer(SEQUENCED, [tensor], sequence_id=7, sequence_start=True))
        assert "the embedded backend has no sequence batcher" in error.message()
