"""Repository reading: which folders are versions and which versions the policy selects."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from services.gateway import repository
from services.gateway.errors import ModelNotFound
from services.modelrepo.config import read_config

CONFIG = """
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 8
input { name: "x" data_type: TYPE_FP32 dims: [ -1, 4 ] }
output { name: "y" data_type: TYPE_FP16 dims: 2 }
"""


def _model(root: Path, policy: str, versions: list[str]) -> Path:
    model = root / "m"
    model.mkdir(parents=True)
    (model / "config.pbtxt").write_text(CONFIG + policy)
    for name in versions:
        (model / name).mkdir()
        (model / name / "model.onnx").write_bytes(b"graph")
    return model


@pytest.mark.parametrize(
    ("policy", "selected"),
    [
        ("", (3, 10)[-1:]),
        ("version_policy { latest { num_versions: 2 } }", (3, 10)),
        ("version_policy { all { } }", (1, 3, 10)),
        ("version_policy { specific { versions: [1, 10, 99] } }", (1, 10)),
    ],
    ids=["default-latest-1", "latest-2", "all", "specific"],
)
def test_scan_selects_versions_by_policy_when_repository_read(
    tmp_path: Path, policy: str, selected: tuple[int]
) -> None:
    model = _model(tmp_path, policy, ["1", "3", "10"])
    (model / ".staging-4").mkdir()  # an export in progress
    (model / "7").mkdir()  # no model.onnx: not a version
    (model / "8").mkdir()
    (model / "8" / "model.pt").write_bytes(b"")  # not the file an onnxruntime_onnx config names
    entry = repository.scan(tmp_path)["m"]
    assert entry.available == (1, 3, 10)
    assert entry.selected == selected


def test_metadata_from_config_maps_types_when_config_parsed(tmp_path: Path) -> None:
    entry = repository.scan(_model(tmp_path, "", ["1"]).parent)["m"]
    metadata = entry.metadata((1,))
    assert metadata.max_batch_size == 8
    assert metadata.inputs[0].datatype == "FP32"
    assert metadata.inputs[0].dims == (-1, 4)
    assert metadata.outputs[0].datatype == "FP16"
    assert metadata.served_shape(metadata.inputs[0]) == [-1, -1, 4]


def test_scan_reports_the_model_problem_and_keeps_the_others_when_a_config_is_unparsable(tmp_path: Path) -> None:
    _model(tmp_path, "", ["1"])
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.pbtxt").write_text("max_batch_size: [")
    entries = repository.scan(tmp_path)
    assert entries["m"].problem is None
    assert entries["bad"].problem is not None
    assert "cannot read" in entries["bad"].problem
    assert "bad/config.pbtxt" in entries["bad"].problem
    assert entries["bad"].available == ()


def test_scan_reports_a_config_naming_another_model_when_names_differ(tmp_path: Path) -> None:
    model = _model(tmp_path, "", ["1"])
    (model / "config.pbtxt").write_text(CONFIG.replace('name: "m"', 'name: "other"'))
    assert "names model 'other' but lies in m/" in str(repository.scan(tmp_path)["m"].problem)


@pytest.mark.parametrize(
    ("config", "files", "expected"),
    [
        ('platform: "onnxruntime_onnx" default_model_filename: "net.onnx"', ["net.onnx"], (1,)),
        ('platform: "onnxruntime_onnx" default_model_filename: "net.onnx"', ["model.onnx"], ()),
        ('backend: "onnxruntime"', ["model.onnx"], (1,)),
        ('backend: "pytorch"', ["model.pt"], (1,)),
        ('platform: "tensorrt_plan"', ["model.plan"], (1,)),
        ('backend: "python"', ["model.py"], (1,)),
        ('platform: "ensemble"', [], (1,)),
    ],
    ids=["default-filename", "default-filename-missing", "onnx-backend", "pytorch", "tensorrt", "python", "ensemble"],
)
def test_scan_finds_versions_by_the_model_file_the_config_names_when_written_by_hand(
    tmp_path: Path, config: str, files: list[str], expected: tuple[int, ...]
) -> None:
    model = tmp_path / "hand"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(config)
    for name in files:
        (model / "1" / name).write_bytes(b"")
    entry = repository.scan(tmp_path)["hand"]
    assert (entry.config.name, entry.available) == ("hand", expected)


def test_scan_raises_repository_error_when_folder_missing(tmp_path: Path) -> None:
    with pytest.raises(repository.RepositoryError, match="does not exist"):
        repository.scan(tmp_path / "nowhere")


def test_read_config_round_trips_when_written_by_text_format(tmp_path: Path) -> None:
    config = model_config_pb2.ModelConfig(name="m", platform="pytorch_libtorch", max_batch_size=4)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text(text_format.MessageToString(config))
    assert read_config(tmp_path / "m") == config


def test_catalog_scan_reports_no_serving_version_as_new_when_a_missing_model_folder_comes_back(
    tmp_path: Path,
) -> None:
    model = _model(tmp_path / "repository", "", ["1", "2"])
    catalog = repository.Catalog(tmp_path / "repository")
    catalog.scan()
    model.rename(tmp_path / "away")
    assert catalog.scan().missing_models == ("m",)
    assert catalog.scan().missing_models == ("m",)  # still away on the next scan
    (tmp_path / "away").rename(model)
    (model / "3").mkdir()  # exported while the folder was away: that one is new
    (model / "3" / "model.onnx").write_bytes(b"graph")
    back = catalog.scan()
    assert (back.new_versions, back.missing_models) == ({"m": (3,)}, ())
    assert catalog.entry("m").available == (1, 2, 3)


def test_catalog_refresh_names_the_model_file_it_looked_for_when_a_version_folder_has_none(tmp_path: Path) -> None:
    model = _model(tmp_path, "", ["1"])
    (model / "5" / "samples").mkdir(parents=True)  # the exporter's manifest and samples, no model.onnx
    (model / "5" / "manifest.json").write_text("{}")
    catalog = repository.Catalog(tmp_path)
    catalog.scan()
    with pytest.raises(ModelNotFound) as raised:
        catalog.refresh("m", 5)
    assert str(raised.value) == (
        f"Request for unknown model: 'm' version 5 is not found; its folder {model / '5'} is there but holds no "
        "model file: expected model.onnx (Triton's file name for onnxruntime_onnx, as config.pbtxt names no "
        "default_model_filename)"
    )
    with pytest.raises(ModelNotFound, match="; the repository has no version 6 of it$"):
        catalog.refresh("m", 6)
