"""Where the parity gate runs: a ``--kind gpu`` export is checked on ``cuda:0`` when this process has a usable GPU,
else on the CPU with the reason in its summary and manifest; a ``kind cpu`` export says what it always said. The
machine decides which of the two a GPU export shows, so those tests assert whichever this machine has."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from examples.models import build_mlp, mlp_inputs
from exporter import export
from exporter.cli import summary_table
from exporter.parity import onnx_runner
from exporter.parity_device import (
    CPU_PROVIDER,
    CUDA_PROVIDER,
    ON_CPU,
    ParityDevice,
    choose_parity_device,
    gpu_unusable,
    onnx_providers,
)
from exporter.specs import Format

ROOT = Path(__file__).parents[2]


def expected_note(format: Format) -> str:
    why = gpu_unusable(format)
    return f"parity checked on the CPU: no usable GPU ({why})" if why else "parity checked on cuda:0"


def relu_onnx(path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.parametrize("format", ["onnx", "torchscript"])
def test_parity_device_follows_the_kind_and_what_this_process_offers_when_chosen(format: Format) -> None:
    assert choose_parity_device("cpu", format) == ON_CPU
    assert ON_CPU.note == ""
    chosen = choose_parity_device("gpu", format)
    assert chosen.asked_gpu
    assert chosen.note == expected_note(format)
    assert chosen.runtime == ("cpu" if gpu_unusable(format) else "cuda:0")
    assert chosen.eager == ("cuda:0" if format == "torchscript" and chosen.runtime != "cpu" else "cpu")


def test_onnx_gate_asks_for_the_cuda_provider_without_tf32_when_on_a_gpu() -> None:
    on_gpu = ParityDevice(runtime="cuda:1", asked_gpu=True)
    assert onnx_providers(on_gpu) == [(CUDA_PROVIDER, {"device_id": 1, "use_tf32": 0}), CPU_PROVIDER]
    assert onnx_providers(ON_CPU) == [CPU_PROVIDER]


@pytest.mark.skipif(not gpu_unusable("onnx"), reason="onnxruntime here starts CUDAExecutionProvider")
def test_onnx_gate_reports_the_cpu_when_onnxruntime_would_not_start_cuda(tmp_path: Path) -> None:
    """onnxruntime answers a CUDA session it cannot make with a CPU one and a warning: the gate says so."""
    asked = ParityDevice(runtime="cuda:0", asked_gpu=True)
    with pytest.warns(UserWarning, match=CUDA_PROVIDER):
        run, device = onnx_runner(relu_onnx(tmp_path / "relu.onnx"), ["x"], asked)
    assert device.runtime == "cpu"
    assert device.note.startswith(f"parity checked on the CPU: no usable GPU (onnxruntime could not start "
                                  f"{CUDA_PROVIDER} (the session runs on {CPU_PROVIDER})")
    out = run((torch.tensor([[-1.0, 0.5, 2.0]]),))
    np.testing.assert_array_equal(out[0], [[0.0, 0.5, 2.0]])


@pytest.mark.slow  # exports a model
def test_cli_gpu_export_says_where_parity_ran_when_exported(repo: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "services", "export", "examples.models:build_mlp", "--name", "mlp", "--repository",
         str(repo), "--input", "features:FP32:32", "--format", "torchscript", "--kind", "gpu"],
        capture_output=True, text=True, cwd=ROOT, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr
    note = expected_note("torchscript")
    assert note in " ".join(done.stdout.split())
    manifest = json.loads(next((repo / "mlp" / "1").glob("manifest.json")).read_text())
    assert manifest["parity"]["device"] == ("cpu" if gpu_unusable("torchscript") else "cuda:0")
    assert manifest["parity"]["device_note"] == note
    assert "KIND_GPU" in (repo / "mlp" / "config.pbtxt").read_text()


@pytest.mark.slow  # exports two models
@pytest.mark.parametrize(("kind", "format"), [("cpu", "onnx"), ("gpu", "onnx")])
def test_export_result_names_the_parity_device_only_for_a_gpu_export(repo: Path, kind: str, format: Format) -> None:
    result = export(build_mlp(), mlp_inputs(), name=f"mlp_{kind}", repository=repo, format=format,
                    kind=kind, max_batch_size=8)  # type: ignore[arg-type]
    caption = str(summary_table(result).caption)
    if kind == "cpu":
        assert (result.parity.device, result.parity.device_note) == ("cpu", "")
        assert "parity checked" not in caption
        assert caption.startswith(f"onnx via {result.exporter}; parity at batch sizes [1, 7, 8]")
        return
    assert result.parity.device_note == expected_note(format)
    assert f"parity at batch sizes [1, 7, 8]; {expected_note(format)}" in caption
