"""Repository reading: which folders are versions and which versions the policy selects."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from services.gateway import repository

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
        (model / name / "manifest.json").write_text("{}")
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
    (model / ".tmp-4").mkdir()  # an export in progress
    (model / "7").mkdir()  # no manifest: not a version
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


def test_scan_raises_repository_error_when_config_unparsable(tmp_path: Path) -> None:
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.pbtxt").write_text("max_batch_size: [")
    with pytest.raises(repository.RepositoryError, match="cannot read .*bad/config.pbtxt"):
        repository.scan(tmp_path)


def test_scan_raises_repository_error_when_folder_missing(tmp_path: Path) -> None:
    with pytest.raises(repository.RepositoryError, match="does not exist"):
        repository.scan(tmp_path / "nowhere")


def test_read_config_round_trips_when_written_by_text_format(tmp_path: Path) -> None:
    config = model_config_pb2.ModelConfig(name="m", platform="pytorch_libtorch", max_batch_size=4)
    (tmp_path / "config.pbtxt").write_text(text_format.MessageToString(config))
    assert repository.read_config(tmp_path) == config
