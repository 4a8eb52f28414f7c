"""A Triton model repository the exporter did not write, and the checks that a gateway serves it.

``make_foreign_repository`` copies the example repository without the exporter's manifests and samples, adds
``addsub`` (an INT32 add/sub model built with ``onnx.helper``, its config written by hand with ``backend`` instead
of ``platform``, a custom model file name and a ``model_warmup``) and ``engine`` (a TensorRT plan, which neither
the embedded backend nor the CPU Triton can run).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import numpy as np
import onnx
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper
from tritonclient.grpc import model_config_pb2 as mc

from services.gateway.tensors.datatypes import from_config
from services.modelrepo.config import read_config, select_versions
from services.modelrepo.layout import versions
from tests.gateway_harness import RunningGateway, onnx_reference

SERVED = ("addsub", "classifier", "mlp")

ADDSUB_CONFIG = """
backend: "onnxruntime"
default_model_filename: "addsub.onnx"
max_batch_size: 8
input { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }
input { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
output { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }
output { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
model_warmup {
  name: "hand_written" batch_size: 2
  inputs { key: "INPUT0" value { data_type: TYPE_INT32 dims: [ 16 ] zero_data: true } }
  inputs { key: "INPUT1" value { data_type: TYPE_INT32 dims: [ 16 ] random_data: true } }
}
"""

ENGINE_CONFIG = """
name: "engine"
platform: "tensorrt_plan"
max_batch_size: 4
input { name: "x" data_type: TYPE_FP32 dims: [ 8 ] }
output { name: "y" data_type: TYPE_FP32 dims: [ 8 ] }
"""


def addsub_graph() -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 over INT32 [batch, 16]."""
    shape = ["batch", 16]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT32, shape) for n in ("INPUT0", "INPUT1")]
    outputs = [helper.make_tensor_value_info(n, TensorProto.INT32, shape) for n in ("OUTPUT0", "OUTPUT1")]
    nodes = [
        helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
        helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
    ]
    graph = helper.make_graph(nodes, "addsub", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="hand")
    model.ir_version = 8  # what any onnxruntime of the last years reads
    onnx.checker.check_model(model)
    return model


def addsub_repository_at(root: Path) -> Path:
    """A repository of ``addsub`` alone (built with onnx.helper): no exporter run, a gateway starts on it in seconds."""
    (root / "addsub" / "1").mkdir(parents=True)
    onnx.save(addsub_graph(), root / "addsub" / "1" / "addsub.onnx")
    (root / "addsub" / "config.pbtxt").write_text(ADDSUB_CONFIG)
    return root


def make_foreign_repository(examples: Path, target: Path) -> Path:
    shutil.copytree(examples, target, ignore=shutil.ignore_patterns("manifest.json", "samples", "mlp_ts"))
    assert not list(target.rglob("manifest.json"))
    addsub = target / "addsub"
    for version in ("1", "3"):  # no version_policy: Triton's default serves the latest only
        (addsub / version).mkdir(parents=True)
        onnx.save(addsub_graph(), addsub / version / "addsub.onnx")
    (addsub / "config.pbtxt").write_text(ADDSUB_CONFIG)
    engine = target / "engine"
    (engine / "1").mkdir(parents=True)
    (engine / "1" / "model.plan").write_bytes(b"not a serialized engine for this machine")
    (engine / "config.pbtxt").write_text(ENGINE_CONFIG)
    return target


def check_every_model_serves(gateway: RunningGateway, repository: Path) -> None:
    """Each servable model answers like onnxruntime on its own model file, and its v2 metadata is its config."""
    reference = onnx_reference(repository)
    generator = np.random.default_rng(7)
    with grpcclient.InferenceServerClient(gateway.grpc_url) as client:
        for model in SERVED:
            config = read_config(repository / model)
            selected = select_versions(config, versions(repository / model, config))
            served = selected[-1]
            metadata = client.get_model_metadata(model, as_json=True)
            assert metadata["platform"] == (config.platform or config.backend)
            assert metadata["versions"] == [str(v) for v in selected]
            assert _tensors(metadata["inputs"]) == _expected(config, config.input)
            assert _tensors(metadata["outputs"]) == _expected(config, config.output)
            inputs = {}
            for tensor in config.input:
                dims = [3, *tensor.dims]
                if tensor.data_type == mc.TYPE_INT32:
                    inputs[tensor.name] = generator.integers(-1000, 1000, dims, dtype=np.int32)
                else:
                    inputs[tensor.name] = generator.standard_normal(dims).astype(np.float32)
            wire = []
            for name, array in inputs.items():
                tensor_in = grpcclient.InferInput(name, list(array.shape), from_config(_dtype(config, name)))
                tensor_in.set_data_from_numpy(array)
                wire.append(tensor_in)
            result = client.infer(model, wire)
            assert result.get_response().model_version == str(served)
            for name, want in reference(model, served, inputs).items():
                np.testing.assert_allclose(result.as_numpy(name), want, rtol=1e-5, atol=1e-5)


def check_engine_unavailable(gateway: RunningGateway, *reason_parts: str) -> str:
    """The TensorRT model is reported with its reason, and the gateway is still ready for the others."""
    base = f"http://{gateway.http_url}"
    answer = httpx.get(f"{base}/v2/models/engine/ready")
    assert answer.status_code == 503
    reason = str(answer.json()["error"])
    for part in reason_parts:
        assert part in reason, reason
    infer = httpx.post(f"{base}/v2/models/engine/infer", json={"inputs": []})
    assert infer.status_code == 503
    assert reason_parts[0] in infer.json()["error"]
    assert httpx.get(f"{base}/v2/health/ready").status_code == 200
    return reason


def _dtype(config: mc.ModelConfig, name: str) -> int:
    return int(next(t.data_type for t in config.input if t.name == name))


def _tensors(entries: list[dict[str, object]]) -> list[tuple[object, object, list[int]]]:
    return [(e["name"], e["datatype"], [int(d) for d in e["shape"]]) for e in entries]  # type: ignore[attr-defined]


def _expected(config: mc.ModelConfig, tensors: object) -> list[tuple[object, object, list[int]]]:
    batch = [-1] if config.max_batch_size > 0 else []
    return [(t.name, from_config(t.data_type), [*batch, *t.dims]) for t in tensors]  # type: ignore[attr-defined]
