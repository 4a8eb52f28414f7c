"""What the gateway runs to warm a version up, read from the config's ``model_warmup`` as Triton reads it: samples
of batch size 0 skipped, ``zero_data`` strings empty, data files read for as many bytes as the dims need, an input
without data refused; and invented inputs marked as such when nothing is declared."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from services.gateway.versions.warmup import INVENTED, WarmupError, warmup_requests

CONFIG = """
name: "m"
max_batch_size: 4
input { name: "text" data_type: TYPE_STRING dims: [ 2 ] }
input { name: "x" data_type: TYPE_INT32 dims: [ 3 ] }
"""


def _sample(name: str, batch_size: int, x: str) -> str:
    return (
        f'model_warmup {{ name: "{name}" batch_size: {batch_size} '
        'inputs { key: "text" value { data_type: TYPE_STRING dims: [ 2 ] zero_data: true } } '
        f'inputs {{ key: "x" value {{ data_type: TYPE_INT32 dims: [ 3 ] {x} }} }} }}'
    )


def _config(*samples: str) -> mc.ModelConfig:
    return text_format.Parse(CONFIG + "\n".join(samples), mc.ModelConfig())


def test_warmup_skips_samples_of_batch_size_zero_and_invents_inputs_when_none_is_left(tmp_path: Path) -> None:
    (plan,) = warmup_requests(tmp_path, 1, _config(_sample("skipped", 0, "zero_data: true")))
    assert (plan.source, plan.invented) == (INVENTED, True)
    (declared,) = warmup_requests(tmp_path, 1, _config(_sample("skipped", 0, "zero_data: true"),
                                                       _sample("kept", 3, "zero_data: true")))
    assert (declared.source, declared.invented) == ("model_warmup 'kept' (batch 3)", False)
    assert declared.inputs["text"].tolist() == [[b"", b""]] * 3  # zero_data strings: a zero length each
    assert declared.inputs["x"].tolist() == [[0, 0, 0]] * 3


def test_warmup_reads_the_bytes_the_dims_need_when_a_data_file_holds_more(tmp_path: Path) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "x.bin").write_bytes(np.arange(5, dtype=np.int32).tobytes())
    (plan,) = warmup_requests(tmp_path, 1, _config(_sample("file", 1, 'input_data_file: "x.bin"')))
    assert plan.inputs["x"].tolist() == [[0, 1, 2]]


def test_warmup_refuses_a_data_file_with_fewer_bytes_than_the_dims_need(tmp_path: Path) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "x.bin").write_bytes(np.arange(2, dtype=np.int32).tobytes())
    with pytest.raises(WarmupError, match=r"x\.bin has 8 bytes, dims \[3\] of INT32 need 12"):
        warmup_requests(tmp_path, 1, _config(_sample("file", 1, 'input_data_file: "x.bin"')))


def test_warmup_refuses_an_input_that_sets_no_data_when_the_config_declares_it(tmp_path: Path) -> None:
    with pytest.raises(WarmupError, match="model_warmup 'bare': input 'x' sets none of zero_data, random_data"):
        warmup_requests(tmp_path, 1, _config(_sample("bare", 1, "")))


def _exported_version(root: Path, samples: bytes) -> Path:
    """A version folder as the exporter leaves it (manifest, samples/inputs.npz), with ``samples`` as that file."""
    version = root / "1"
    (version / "samples").mkdir(parents=True)
    (version / "manifest.json").write_text(json.dumps({
        "name": "m", "version": 1, "format": "onnx", "platform": "onnxruntime_onnx", "artifact": "model.onnx",
        "exporter": "test", "max_batch_size": 4, "inputs": [], "outputs": [], "files": {}, "toolchain": {},
        "parity": {},
    }))
    (version / "samples" / "inputs.npz").write_bytes(samples)
    return version / "samples" / "inputs.npz"


@pytest.mark.parametrize(
    ("samples", "fault"),
    [
        (b"not an archive at all " * 4, "it is neither a zip archive of arrays nor an array"),
        (b"", "the file is empty"),
        (b"PK\x03\x04 cut short", "its zip archive is damaged"),
    ],
    ids=["garbage", "empty", "truncated-zip"],
)
def test_warmup_names_the_samples_file_and_what_it_should_be_when_it_is_not_an_npz(
    tmp_path: Path, samples: bytes, fault: str
) -> None:
    path = _exported_version(tmp_path, samples)
    with pytest.raises(WarmupError) as raised:
        warmup_requests(tmp_path, 1, _config())
    message = str(raised.value)
    assert f"{path} is not a valid .npz of arrays (numpy.savez: one array per tensor name): {fault}" in message
    assert "pickle" not in message  # numpy's advice to load it unsafely is no help here


def test_warmup_names_the_inputs_the_samples_file_lacks_when_it_holds_other_arrays(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, text=np.array([[b"a", b"b"]], dtype=object).astype(bytes))
    path = _exported_version(tmp_path, buffer.getvalue())
    with pytest.raises(WarmupError, match=re.escape(f"{path} has no array for input(s) x of config.pbtxt (it holds: "
                                                    "text)")):
        warmup_requests(tmp_path, 1, _config())
