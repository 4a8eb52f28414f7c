"""End-to-end exports of the example models: artifacts, configs, manifests, numbering."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from examples.models import build_classifier, build_mlp, build_mlp_v2, classifier_inputs, mlp_inputs
from exporter import ExportError, InvalidSpecError, RepositoryError, export
from exporter.repository import ModelRepository
from services.modelrepo.manifest import is_released, read_manifest, read_samples
from tests.exporter.helpers import listing


def parse_config(path: Path) -> mc.ModelConfig:
    return text_format.Parse(path.read_text(), mc.ModelConfig())


@pytest.mark.slow  # exports models
def test_export_writes_verified_onnx_version_when_classifier_exported(repo: Path) -> None:
    module = build_classifier()
    result = export(module, classifier_inputs(2), name="classifier", repository=repo,
                    input_names=["image"], version_policy="all", preferred_batch_sizes=[8, 16], priority_levels=3)

    assert result.version == 1
    assert result.model_dir == repo / "classifier" / "1"
    assert result.exporter == "torch.onnx.dynamo"
    assert 0 <= result.max_abs_error < 1e-4
    assert result.parity.batch_sizes == (1, 7, 32)

    config = parse_config(result.config_path)
    assert config.name == "classifier"
    assert config.platform == "onnxruntime_onnx"
    assert config.max_batch_size == 32
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [("image", mc.TYPE_FP32, [3, 64, 64])]
    assert [(t.name, t.data_type, list(t.dims)) for t in config.output] == [("output", mc.TYPE_FP32, [10])]
    assert list(config.dynamic_batching.preferred_batch_size) == [8, 16]
    assert config.dynamic_batching.max_queue_delay_microseconds == 2000
    assert (config.dynamic_batching.priority_levels, config.dynamic_batching.default_priority_level) == (3, 2)
    # Without both, Triton ignores the request's v2 timeout parameter the gateway sends.
    assert config.dynamic_batching.default_queue_policy.allow_timeout_override
    assert config.dynamic_batching.default_queue_policy.default_timeout_microseconds == 300_000_000
    assert config.instance_group[0].count == 2
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU
    assert config.version_policy.WhichOneof("policy_choice") == "all"
    warmup = config.model_warmup[0]
    assert warmup.batch_size == 1
    assert warmup.inputs["image"].input_data_file == "image"
    raw = (repo / "classifier" / "warmup" / "image").read_bytes()
    assert len(raw) == 3 * 64 * 64 * 4

    session = ort.InferenceSession(str(result.model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    batch = classifier_inputs(5, seed=9)
    (got,) = session.run(None, {"image": batch.numpy()})
    with torch.no_grad():
        expected = module(batch).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.slow  # exports models
def test_export_manifest_records_hashes_toolchain_parity_and_samples_when_published(repo: Path) -> None:
    result = export(build_mlp(), {"features": mlp_inputs(3)}, name="mlp", repository=repo)

    manifest = read_manifest(result.model_dir)
    assert manifest.name == "mlp"
    assert manifest.version == 1
    assert manifest.exporter == "torch.onnx.dynamo"
    assert set(manifest.files) == {"model.onnx", "samples/inputs.npz", "samples/outputs.npz"}
    assert all(len(h) == 64 for h in manifest.files.values())
    assert manifest.toolchain["torch"] == torch.__version__
    assert int(manifest.toolchain["opset"]) >= 17
    assert manifest.parity["passed"] is True
    assert [o.name for o in manifest.outputs] == ["logits", "probabilities"]
    samples = read_samples(result.model_dir, manifest.sample_inputs)
    expected = read_samples(result.model_dir, manifest.sample_outputs)
    assert samples["features"].shape == (3, 32)
    assert set(expected) == {"logits", "probabilities"}
    with torch.no_grad():
        eager = build_mlp()(torch.from_numpy(samples["features"]))
    np.testing.assert_allclose(expected["logits"], eager["logits"].numpy(), rtol=1e-6)
    assert json.loads((result.model_dir / "manifest.json").read_text())["format_version"] == 1


@pytest.mark.slow  # exports models
def test_export_writes_torchscript_with_triton_names_when_format_is_torchscript(repo: Path) -> None:
    module = build_mlp()
    result = export(module, mlp_inputs(4), name="mlp_ts", repository=repo, format="torchscript")

    assert result.exporter == "torch.jit.script"
    config = parse_config(result.config_path)
    assert config.platform == "pytorch_libtorch"
    assert [t.name for t in config.input] == ["INPUT__0"]
    assert [t.name for t in config.output] == ["OUTPUT__0", "OUTPUT__1"]
    manifest = read_manifest(result.model_dir)
    assert [o.source for o in manifest.outputs] == ["logits", "probabilities"]
    loaded = torch.jit.load(str(result.model_dir / "model.pt"))
    batch = mlp_inputs(6, seed=4)
    with torch.no_grad():
        logits, probabilities = loaded(batch)
        eager = module(batch)
    torch.testing.assert_close(logits, eager["logits"])
    torch.testing.assert_close(probabilities, eager["probabilities"])


@pytest.mark.slow  # exports models
def test_export_numbers_versions_when_exported_repeatedly(repo: Path) -> None:
    first = export(build_mlp(), mlp_inputs(2), name="mlp", repository=repo, input_names=["features"])
    second = export(build_mlp_v2(), mlp_inputs(2), name="mlp", repository=repo, input_names=["features"])
    fifth = export(build_mlp(), mlp_inputs(2), name="mlp", repository=repo, input_names=["features"], version=5,
                   release=True)
    sixth = export(build_mlp(), mlp_inputs(2), name="mlp", repository=repo, input_names=["features"])

    assert (first.version, second.version, fifth.version, sixth.version) == (1, 2, 5, 6)
    # Only a model's first version is released unless asked: a later one serves once activated.
    assert (first.released, second.released, fifth.released, sixth.released) == (True, False, True, False)
    assert [is_released(r.model_dir) for r in (first, second, fifth, sixth)] == [True, False, True, False]
    v1 = ort.InferenceSession(str(first.model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    v2 = ort.InferenceSession(str(second.model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    x = {"features": mlp_inputs(2, seed=5).numpy()}
    assert not np.allclose(v1.run(None, x)[0], v2.run(None, x)[0])


@pytest.mark.slow  # exports models
def test_export_refuses_existing_version_when_version_given(repo: Path) -> None:
    export(build_mlp(), mlp_inputs(2), name="mlp", repository=repo, input_names=["features"])
    before = listing(repo)

    with pytest.raises(RepositoryError, match="version 1 of model 'mlp' already exists"):
        export(build_mlp(), mlp_inputs(2), name="mlp", repository=repo, input_names=["features"], version=1)

    assert listing(repo) == before


@pytest.mark.slow  # exports models
def test_export_refuses_other_signature_when_model_has_versions(repo: Path) -> None:
    export(build_mlp(), mlp_inputs(2), name="mlp", repository=repo, input_names=["features"])
    before = listing(repo)

    with pytest.raises(RepositoryError, match="share one config.pbtxt"):
        export(build_mlp(), mlp_inputs(2), name="mlp", repository=repo, input_names=["renamed"])

    assert listing(repo) == before


@pytest.mark.slow  # exports models
def test_export_numbers_past_folder_when_it_holds_no_model_file(repo: Path) -> None:
    (repo / "mlp" / "3").mkdir(parents=True)  # a version still being copied in, or a broken one

    result = export(build_mlp(), mlp_inputs(2), name="mlp", repository=repo, input_names=["features"])

    assert result.version == 4
    assert listing(repo / "mlp" / "3") == []


def test_export_refuses_repository_when_its_path_is_a_file(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "model_repository"
    not_a_folder.write_text("")

    with pytest.raises(RepositoryError, match=r"cannot write to the model repository .*: it is a file, not a folder"):
        export(build_mlp(), mlp_inputs(2), name="mlp", repository=not_a_folder, input_names=["features"])


def test_repository_numbers_versions_by_version_folders_only(repo: Path) -> None:
    # A superscript and an Arabic-Indic digit pass str.isdigit(); Triton skips "07" and the gateway "0"
    for folder in ("1", "²", "٣", "07", "0", "3"):
        (repo / "m" / folder).mkdir(parents=True)

    assert ModelRepository(repo).versions("m") == [1, 3]
    assert ModelRepository(repo).next_version("m") == 4


def test_export_refuses_model_when_its_config_is_unreadable(repo: Path) -> None:
    (repo / "mlp").mkdir(parents=True)
    (repo / "mlp" / "config.pbtxt").write_text("platform: {{ not protobuf text")
    before = listing(repo)

    with pytest.raises(RepositoryError, match=r"cannot read .*mlp/config.pbtxt.*fix it, or export under a new"):
        export(build_mlp(), mlp_inputs(2), name="mlp", repository=repo, input_names=["features"])

    assert listing(repo) == before


@pytest.mark.parametrize("name", ["../escape", "a/b", "", ".hidden", "spaces here", "semi;colon"])
def test_export_refuses_name_when_it_is_not_a_safe_directory_name(repo: Path, name: str) -> None:
    with pytest.raises(InvalidSpecError, match="invalid model name"):
        export(build_mlp(), mlp_inputs(2), name=name, repository=repo)

    assert listing(repo) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_batch_size": -1}, r"max_batch_size must be at least 1 for a model with a batch dim, or 0 for one "
                                 r"without \(got -1\)"),
        ({"version": 0}, "version must be an integer >= 1"),
        ({"format": "tflite"}, "expected 'onnx' or 'torchscript'"),
        ({"version_policy": "newest"}, "expected 'latest:N', 'all' or 'specific:1,2'"),
        ({"preferred_batch_sizes": [64]}, "between 1 and max_batch_size=32"),
        ({"priority_levels": -1}, "priority_levels must lie between 0"),
    ],
)
def test_export_refuses_options_when_they_are_invalid(repo: Path, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ExportError, match=message):
        export(build_mlp(), mlp_inputs(2), name="mlp", repository=repo, **kwargs)  # type: ignore[arg-type]

    assert listing(repo) == []


class ScriptedGate(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) * 2


@pytest.mark.slow  # exports models
def test_export_falls_back_to_torchscript_onnx_exporter_when_dynamo_cannot_take_the_module(repo: Path) -> None:
    scripted = torch.jit.script(ScriptedGate().eval())  # torch.export cannot trace a ScriptModule

    result = export(scripted, torch.randn(3, 4), name="scripted", repository=repo)

    assert result.exporter == "torch.onnx.torchscript"
    assert any("dynamo exporter failed" in note for note in result.notes)
    assert read_manifest(result.model_dir).exporter == "torch.onnx.torchscript"
    assert result.max_abs_error < 1e-4


def test_export_refuses_version_policy_when_it_would_select_no_version(repo: Path) -> None:
    # Triton refuses such a model: "at least one version must be available under the version policy".
    with pytest.raises(InvalidSpecError, match=r"version policy specific:5 selects none of the versions model "
                                               r"'mlp' would have, \[1\] \(version 1 being this export\): Triton "
                                               r"refuses to load a model whose policy selects no version"):
        export(build_mlp(), mlp_inputs(2), name="mlp", repository=repo, input_names=["features"],
               version_policy="specific:5")

    assert listing(repo) == []


@pytest.mark.slow  # exports models
def test_export_keeps_the_config_when_a_later_versions_policy_would_select_no_version(repo: Path) -> None:
    export(build_mlp(), mlp_inputs(2), name="mlp", repository=repo, input_names=["features"])
    before = {path: (repo / path).read_bytes() for path in listing(repo) if (repo / path).is_file()}

    with pytest.raises(InvalidSpecError, match=r"specific:7,9 selects none of the versions model 'mlp' would have, "
                                               r"\[1, 2\].*"
                                               r"List versions that exist \(e\.g\. specific:2\)"):
        export(build_mlp(), mlp_inputs(2), name="mlp", repository=repo, input_names=["features"],
               version_policy="specific:7,9")

    assert {path: (repo / path).read_bytes() for path in listing(repo) if (repo / path).is_file()} == before
    selected = export(build_mlp(), mlp_inputs(2), name="mlp", repository=repo, input_names=["features"],
                      version_policy="specific:1")  # an older version alone is fine: the model still loads
    assert selected.version == 2


@pytest.mark.slow  # exports models
def test_export_writes_the_opset_asked_for_when_torch_export_cannot_convert_to_it(repo: Path) -> None:
    # torch.export's exporter writes opset 18 and fails to convert this graph down to 9, keeping 18 with a warning.
    result = export(build_mlp(), mlp_inputs(2), name="mlp", repository=repo, input_names=["features"], opset=9)

    model = onnx.load(str(result.model_dir / "model.onnx"))
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [9]
    assert read_manifest(result.model_dir).toolchain["opset"] == "9"
    assert result.exporter == "torch.onnx.torchscript"
    assert any("not the opset 9 asked for" in note for note in result.notes)
    assert result.parity.passed


@pytest.mark.slow  # exports models
def test_export_refuses_opset_when_no_exporter_can_write_it(repo: Path) -> None:
    with pytest.raises(ExportError, match=r"opset=99 is not one the installed ONNX exporters can write: .* 7 to \d+"):
        export(build_mlp(), mlp_inputs(2), name="mlp", repository=repo, input_names=["features"], opset=99)

    assert listing(repo) == []


@pytest.mark.slow  # exports a model
def test_export_writes_an_old_opset_whose_graph_lists_its_weights_as_inputs(repo: Path) -> None:
    """Below IR version 4 every weight is a graph input as well: those are no inputs of the model's, and their fixed
    first dim is no pinned batch axis (it was refused as "input 'inner.weight' has a fixed batch axis")."""
    result = export(torch.nn.Linear(4, 2), torch.randn(2, 4), name="lin", repository=repo, opset=7)

    model = onnx.load(str(result.model_dir / "model.onnx"))
    weights = {initializer.name for initializer in model.graph.initializer}
    assert weights & {value.name for value in model.graph.input}  # the old form: weights listed as inputs
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [7]
    assert result.parity.passed
