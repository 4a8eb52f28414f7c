"""The derived repository: python-backend configs that keep the exporter's contract, rebuilt incrementally."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

from services.tritonlocal import DerivedRepositoryError, build_derived_repository, derive_config
from services.tritonlocal.derive import ARTIFACT_PARAMETER, RUNTIME_PARAMETER

EXPORTER_CONFIG = """
name: "mlp"
platform: "onnxruntime_onnx"
version_policy { all {} }
max_batch_size: 32
input { name: "features" data_type: TYPE_FP32 dims: 32 }
output { name: "logits" data_type: TYPE_FP32 dims: 8 }
output { name: "probabilities" data_type: TYPE_FP32 dims: 8 }
instance_group { count: 2 kind: KIND_CPU }
dynamic_batching { max_queue_delay_microseconds: 2000 preferred_batch_size: 8 }
optimization { execution_accelerators { cpu_execution_accelerator { name: "openvino" } } }
model_warmup {
  name: "sample_request" batch_size: 1
  inputs { key: "features" value { data_type: TYPE_FP32 dims: 32 input_data_file: "features" } }
}
"""


def make_source(root: Path, versions: dict[int, str]) -> Path:
    model = root / "mlp"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.pbtxt").write_text(EXPORTER_CONFIG)
    (model / "warmup").mkdir(exist_ok=True)
    (model / "warmup" / "features").write_bytes(b"\0" * 128)
    for version, artifact in versions.items():
        (model / str(version) / "samples").mkdir(parents=True, exist_ok=True)
        (model / str(version) / artifact).write_bytes(f"weights of v{version}".encode())
        (model / str(version) / "manifest.json").write_text("{}")
    (root / ".staging-mlp-3").mkdir(exist_ok=True)  # the exporter's half-written version: never served
    return root


def test_derive_config_keeps_the_contract_when_switching_to_the_python_backend() -> None:
    source = text_format.Parse(EXPORTER_CONFIG, mc.ModelConfig())
    derived = derive_config(source)
    assert derived.backend == "python"
    assert derived.platform == ""
    assert not derived.HasField("optimization")
    for field in ("input", "output", "instance_group", "model_warmup"):
        assert list(getattr(derived, field)) == list(getattr(source, field))
    for field in ("name", "max_batch_size", "dynamic_batching", "version_policy"):
        assert getattr(derived, field) == getattr(source, field)
    assert source.platform == "onnxruntime_onnx"  # the argument is left alone


def test_derive_config_runs_gpu_instances_on_cpu_when_the_export_targeted_a_gpu() -> None:
    source = text_format.Parse(EXPORTER_CONFIG, mc.ModelConfig())
    source.instance_group[0].kind = mc.ModelInstanceGroup.KIND_GPU
    source.instance_group[0].gpus.append(0)
    [group] = derive_config(source).instance_group
    assert (group.kind, group.count, list(group.gpus)) == (mc.ModelInstanceGroup.KIND_CPU, 2, [])


def test_build_writes_model_py_and_links_the_artifact_when_the_target_is_new(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src", {1: "model.onnx", 2: "model.onnx", 3: "model.pt"})
    derived = build_derived_repository(source, tmp_path / "derived")
    assert set(derived.models) == {"mlp"}
    assert derived.models["mlp"].versions == (1, 2)  # version 3 lacks the model.onnx its config names
    root = tmp_path / "derived" / "mlp"
    assert sorted(p.name for p in (root / "1").iterdir()) == ["model.onnx", "model.py"]
    assert (root / "1" / "model.onnx").read_bytes() == b"weights of v1"
    assert "class TritonPythonModel" in (root / "2" / "model.py").read_text()
    assert not (root / "3").exists()
    assert (root / "warmup" / "features").stat().st_size == 128
    written = text_format.Parse((root / "config.pbtxt").read_text(), mc.ModelConfig())
    assert written == derived.config("mlp")
    assert written.backend == "python"
    assert written.parameters[ARTIFACT_PARAMETER].string_value == "model.onnx"
    assert written.parameters[RUNTIME_PARAMETER].string_value == "onnx"


def test_build_runs_the_named_model_file_when_the_config_sets_default_model_filename(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src", {1: "resnet.pt"})
    config = source / "mlp" / "config.pbtxt"
    hand_written = 'backend: "pytorch" default_model_filename: "resnet.pt"'
    config.write_text(EXPORTER_CONFIG.replace('platform: "onnxruntime_onnx"', hand_written))
    derived = build_derived_repository(source, tmp_path / "derived").config("mlp")
    assert (derived.backend, derived.default_model_filename) == ("python", "")
    assert derived.parameters[ARTIFACT_PARAMETER].string_value == "resnet.pt"
    assert derived.parameters[RUNTIME_PARAMETER].string_value == "torchscript"
    assert (tmp_path / "derived" / "mlp" / "1" / "resnet.pt").read_bytes() == b"weights of v1"


def test_build_links_other_models_as_they_are_when_no_python_twin_can_run_them(tmp_path: Path) -> None:
    model = tmp_path / "src" / "engine"
    (model / "1" / "plugins").mkdir(parents=True)
    (model / "config.pbtxt").write_text('platform: "tensorrt_plan" max_batch_size: 4')
    (model / "1" / "model.plan").write_bytes(b"plan")
    (model / "1" / "plugins" / "lib.so").write_bytes(b"so")
    derived = build_derived_repository(tmp_path / "src", tmp_path / "derived")
    assert derived.config("engine").platform == "tensorrt_plan"
    assert derived.models["engine"].versions == (1,)
    assert (tmp_path / "derived" / "engine" / "1" / "plugins" / "lib.so").read_bytes() == b"so"
    assert not (tmp_path / "derived" / "engine" / "1" / "model.py").exists()


def test_build_adds_and_removes_versions_when_the_source_changes(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src", {1: "model.onnx"})
    target = tmp_path / "derived"
    build_derived_repository(source, target)
    model_py = target / "mlp" / "1" / "model.py"
    before = model_py.stat().st_mtime_ns
    (target / "mlp" / "1" / "__pycache__").mkdir()  # what the python backend leaves behind

    make_source(source, {2: "model.onnx"})
    assert build_derived_repository(source, target).models["mlp"].versions == (1, 2)
    assert model_py.stat().st_mtime_ns == before  # unchanged files are not rewritten
    assert (target / "mlp" / "2" / "model.onnx").read_bytes() == b"weights of v2"

    for path in sorted((source / "mlp" / "1").rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    (source / "mlp" / "1").rmdir()
    assert build_derived_repository(source, target).models["mlp"].versions == (2,)
    assert not (target / "mlp" / "1").exists()


def test_build_refuses_when_the_target_holds_foreign_files(tmp_path: Path) -> None:
    source = make_source(tmp_path / "src", {1: "model.onnx"})
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    with pytest.raises(DerivedRepositoryError, match="not made by switchyard"):
        build_derived_repository(source, target)
    assert (target / "notes.txt").exists()


def test_build_refuses_when_the_source_is_missing(tmp_path: Path) -> None:
    with pytest.raises(DerivedRepositoryError, match="does not exist"):
        build_derived_repository(tmp_path / "nothing", tmp_path / "derived")


def test_config_json_is_complete_and_pinned_when_versions_are_given(tmp_path: Path) -> None:
    derived = build_derived_repository(make_source(tmp_path / "src", {1: "model.onnx"}), tmp_path / "derived")
    override = json_format.Parse(derived.config_json("mlp", [2, 1]), mc.ModelConfig())
    assert list(override.version_policy.specific.versions) == [1, 2]
    override.version_policy.all.SetInParent()
    assert override == derived.config("mlp")
    assert json.loads(derived.config_json("mlp"))["version_policy"] == {"all": {}}
