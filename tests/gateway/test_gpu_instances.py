"""KIND_GPU instance groups on this CPU machine, with the real onnxruntime and torch: never run on the CPU unnoticed;
the fallback setting runs them there with a warning and a label; KIND_CPU unchanged; the providers and device each
instance gets."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from prometheus_client import CollectorRegistry
from tritonclient.grpc import model_config_pb2 as mc

from services.gateway.backends.devices import (
    CPU,
    CUDA,
    Device,
    Gpus,
    NoUsableGpu,
    gpus,
    onnx_providers,
    plan_instances,
)
from services.gateway.backends.embedded import EmbeddedBackend
from services.gateway.backends.runners import OnnxRunner
from services.gateway.errors import ModelNotReady
from services.gateway.metrics import GatewayMetrics
from services.gateway.repository import Catalog
from services.gateway.tensors.types import InferInput, InferRequest
from services.modelrepo import layout

CONFIG = """
name: "relu"
platform: "onnxruntime_onnx"
max_batch_size: 8
input {{ name: "x" data_type: TYPE_FP32 dims: [ 4 ] }}
output {{ name: "y" data_type: TYPE_FP32 dims: [ 4 ] }}
{groups}
"""


def relu_repository(root: Path, groups: str) -> Catalog:
    (root / "relu" / "1").mkdir(parents=True)
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), root / "relu" / "1" / "model.onnx")
    (root / "relu" / "config.pbtxt").write_text(CONFIG.format(groups=groups))
    catalog = Catalog(root)
    catalog.scan()
    return catalog


def config(*groups: tuple[int, int, list[int]]) -> mc.ModelConfig:
    found = mc.ModelConfig(name="m", platform=layout.ONNX_PLATFORM)
    for kind, count, listed in groups:
        found.instance_group.add(kind=kind, count=count, gpus=listed)
    return found


def test_this_machine_offers_no_gpu_and_says_why() -> None:
    offered = gpus(layout.ONNX_PLATFORM)
    assert (offered.usable, CUDA in ort.get_available_providers()) == (False, False)
    assert f"the installed onnxruntime has no {CUDA} (it offers " in offered.why_not
    assert "CPUExecutionProvider" in offered.why_not


async def test_a_kind_gpu_model_is_unavailable_with_the_reason_and_kind_cpu_loads(tmp_path: Path) -> None:
    catalog = relu_repository(tmp_path, 'instance_group { count: 1 kind: KIND_GPU gpus: [ 0 ] }')
    backend = EmbeddedBackend(catalog)
    try:
        with pytest.raises(ModelNotReady, match=r"instance group 0 is KIND_GPU and this process has no usable GPU: "
                                                r"the installed onnxruntime has no CUDAExecutionProvider") as refused:
            await backend.load("relu", 1)
        assert "set SWITCHYARD_GPU_FALLBACK=cpu to run it on the CPU instead" in str(refused.value)
        assert "has no usable GPU" in (backend.problem("relu") or "")
        assert backend.models()["relu"] == {}
    finally:
        await backend.close()
    cpu_catalog = relu_repository(tmp_path / "cpu", 'instance_group { count: 2 kind: KIND_CPU }')
    backend = EmbeddedBackend(cpu_catalog)
    try:
        await backend.load("relu", 1)
        assert backend.problem("relu") is None
    finally:
        await backend.close()


async def test_the_cpu_fallback_runs_a_kind_gpu_model_with_a_warning_and_a_label(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    catalog = relu_repository(tmp_path, 'instance_group { count: 2 kind: KIND_GPU }')
    registry = CollectorRegistry()
    backend = EmbeddedBackend(catalog, metrics=GatewayMetrics(registry), gpu_fallback="cpu")
    try:
        with caplog.at_level(logging.INFO):
            await backend.load("relu", 1)
        x = np.array([[-1.0, 2.0, -3.0, 4.0]], dtype=np.float32)
        answer = await backend.infer(InferRequest("relu", 1, [InferInput("x", "FP32", x.shape, x)]), version=1,
                                     timeout_s=5.0, priority=0)
        np.testing.assert_array_equal(answer.outputs[0].data, np.maximum(x, 0))
        labels = {"model": "relu", "version": "1", "device": "cpu", "fallback": "cpu"}
        assert registry.get_sample_value("switchyard_model_instances", labels) == 2
        assert "its KIND_GPU instances run on the CPU (SWITCHYARD_GPU_FALLBACK=cpu)" in caplog.text
        assert "loaded model 'relu' version 1 (2 instance(s) on cpu, cpu" in caplog.text
        assert backend.devices("relu", 1) == {"instances": ["cpu", "cpu"], "gpu_fallback": True}  # the admin API's
        await backend.unload("relu", 1)
        assert registry.get_sample_value("switchyard_model_instances", labels) is None
    finally:
        await backend.close()


def test_kind_gpu_instances_go_to_the_gpus_listed_count_on_each() -> None:
    kinds = mc.ModelInstanceGroup
    plan = plan_instances(config((kinds.KIND_GPU, 2, [0, 1]), (kinds.KIND_CPU, 1, [])), layout.ONNX_PLATFORM,
                          fallback="none", offered=Gpus(True, 2))
    assert plan.devices == (Device("cuda", 0), Device("cuda", 0), Device("cuda", 1), Device("cuda", 1), CPU)
    assert [str(d) for d in plan.devices] == ["cuda:0", "cuda:0", "cuda:1", "cuda:1", "cpu"]
    every = plan_instances(config((kinds.KIND_GPU, 1, [])), layout.ONNX_PLATFORM, fallback="none",
                           offered=Gpus(True, 3))
    assert every.devices == (Device("cuda", 0), Device("cuda", 1), Device("cuda", 2))  # none listed: every GPU


def test_kind_auto_takes_a_usable_gpu_else_the_cpu_and_a_missing_device_is_refused() -> None:
    kinds = mc.ModelInstanceGroup
    auto = config((kinds.KIND_AUTO, 1, []))
    assert plan_instances(auto, layout.ONNX_PLATFORM, fallback="none", offered=Gpus(True, 1)).devices == (
        Device("cuda", 0),)
    assert plan_instances(auto, layout.ONNX_PLATFORM, fallback="none").devices == (CPU,)  # this machine
    with pytest.raises(NoUsableGpu, match=r"lists GPU\(s\) \[3\], and this process sees 2 \(0 to 1\)"):
        plan_instances(config((kinds.KIND_GPU, 1, [3])), layout.ONNX_PLATFORM, fallback="none",
                       offered=Gpus(True, 2))


def test_each_device_gets_its_providers_cuda_with_its_device_id_and_tensorrt_when_asked() -> None:
    assert onnx_providers(CPU, tensorrt=False) == ["CPUExecutionProvider"]
    assert onnx_providers(Device("cuda", 1), tensorrt=False) == [
        ("CUDAExecutionProvider", {"device_id": 1}), "CPUExecutionProvider"]
    assert onnx_providers(Device("cuda", 0), tensorrt=True) == [
        ("TensorrtExecutionProvider", {"device_id": 0}), ("CUDAExecutionProvider", {"device_id": 0}),
        "CPUExecutionProvider"]
    asks = config((mc.ModelInstanceGroup.KIND_GPU, 1, [0]))
    asks.optimization.execution_accelerators.gpu_execution_accelerator.add(name="tensorrt")
    with pytest.raises(NoUsableGpu, match="the installed onnxruntime has no TensorrtExecutionProvider"):
        plan_instances(asks, layout.ONNX_PLATFORM, fallback="none", offered=Gpus(True, 1))


def test_a_gpu_session_that_onnxruntime_starts_on_the_cpu_is_refused_not_served(tmp_path: Path) -> None:
    """onnxruntime asked for a GPU provider it cannot start runs the session on the CPU with a log line only (what
    the CPU onnxruntime here does with CUDA, as onnxruntime-gpu does without a driver or cuDNN): refused instead."""
    catalog = relu_repository(tmp_path, "")
    path = catalog.entries["relu"].model_path(1)
    assert path is not None
    refused = pytest.raises(NoUsableGpu, match=f"onnxruntime could not start {CUDA} for model.onnx .*came up on "
                                               "CPUExecutionProvider.*SWITCHYARD_GPU_FALLBACK=cpu")
    with refused, pytest.warns(UserWarning, match=f"Specified provider '{CUDA}' is not in available provider names"):
        OnnxRunner(path, ["y"], intra_op_threads=1, spinning=False,
                   providers=onnx_providers(Device("cuda", 0), tensorrt=False))
    on_cpu = OnnxRunner(path, ["y"], intra_op_threads=1, spinning=False, providers=onnx_providers(CPU, tensorrt=False))
    assert on_cpu.run({"x": np.array([[-1.0, 2.0, -3.0, 4.0]], np.float32)})["y"].tolist() == [[0.0, 2.0, 0.0, 4.0]]


@pytest.mark.slow  # imports torch
def test_torchscript_kind_gpu_says_torch_sees_no_cuda() -> None:
    import torch

    offered = gpus(layout.TORCHSCRIPT_PLATFORM)
    assert offered.usable is torch.cuda.is_available()
    assert f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)" == offered.why_not
