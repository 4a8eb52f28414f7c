"""The inference log and ``switchyard replay`` as an ops person uses them: a real gateway (embedded onnxruntime, on
real ports) writes its log to a folder, and the log is replayed into it. ``scores`` is a tiny classifier whose
version 2's answers differ from version 1's in the fourth digit only; ``bf16_onnx`` takes and answers BF16."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import ml_dtypes
import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from pydantic import SecretStr
from typer.testing import CliRunner, Result

from services.cli import app as switchyard
from services.gateway.settings import Settings
from services.inferlog.compare import SHADOW_COPY
from services.modelrepo import layout
from tests.bf16_models import write_onnx_model
from tests.gateway_harness import RunningGateway, running_gateway

TOKEN = "replay-gateway-admin-token"
CLASSES = 6
SCORES_CONFIG = f"""
name: "scores"
platform: "onnxruntime_onnx"
max_batch_size: 8
input {{ name: "x" data_type: TYPE_FP32 dims: [ {CLASSES} ] }}
output {{ name: "scores" data_type: TYPE_FP32 dims: [ {CLASSES} ] label_filename: "labels.txt" }}
version_policy {{ all {{ }} }}
"""
ROWS = np.random.default_rng(7).normal(size=(5, 2, CLASSES)).astype(np.float32)
"""Five requests of two rows each."""


def write_scores_model(root: Path) -> None:
    """``scores``: version 1 ``scores = 3 x``, version 2 ``scores = 3.0015 x``: its scores differ in the fourth
    digit, as an FP16 export's would (onnxruntime optimises a graph's casts to FP16 and back away)."""
    folder = root / "scores"
    folder.mkdir(parents=True)
    (folder / layout.CONFIG_FILE).write_text(SCORES_CONFIG)
    (folder / "labels.txt").write_text("".join(f"class-{index}\n" for index in range(CLASSES)))
    shape: list[str | int] = ["batch", CLASSES]
    for version, weight in ((1, 3.0), (2, 3.0015)):
        graph = helper.make_graph(
            [helper.make_node("Mul", ["x", "weight"], ["scores"])], "scores",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
            [helper.make_tensor_value_info("scores", TensorProto.FLOAT, shape)],
            initializer=[helper.make_tensor("weight", TensorProto.FLOAT, [], [weight])],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 9  # what the onnxruntime in the venv reads
        (folder / str(version)).mkdir()
        onnx.save(model, str(folder / str(version) / "model.onnx"))


@dataclass(frozen=True)
class Logged:
    gateway: RunningGateway
    log: Path


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Logged]:
    """A gateway logging every request to a folder; requests of both models sent and their records written."""
    folder = tmp_path_factory.mktemp("replay-gateway")
    repository = folder / "repository"
    write_scores_model(repository)
    write_onnx_model(repository)
    log = folder / "log"
    settings = Settings(repository=repository, port=0, grpc_port=None, inference_log=f"file://{log}")
    with running_gateway(settings) as gateway:
        sent = send_requests(httpclient.InferenceServerClient(gateway.http_url))
        deadline = time.monotonic() + 30
        while gateway.metric("switchyard_inference_log_records_total") < sent:
            assert time.monotonic() < deadline, "the inference log did not write the requests' records"
            time.sleep(0.05)
        yield Logged(gateway, log)


BF16_ROWS = np.array([[0.5, -1.25, np.nan, 3.0], [np.inf, -np.inf, 0.0, 1e30]], dtype=np.float32)


def send_requests(client: httpclient.InferenceServerClient) -> int:
    """Each of ROWS to ``scores`` version 1, asked for its top 3 classes; BF16 values (NaN and infinities among them)
    to ``bf16_onnx``; how many requests were sent."""
    for rows in ROWS:
        tensor = httpclient.InferInput("x", list(rows.shape), "FP32")
        tensor.set_data_from_numpy(rows)
        top_3 = httpclient.InferRequestedOutput("scores", class_count=3)
        client.infer("scores", [tensor], model_version="1", outputs=[top_3])
    for rows in (BF16_ROWS, BF16_ROWS[:1]):
        tensor = httpclient.InferInput("x", list(rows.shape), "BF16")
        tensor.set_data_from_numpy(rows.astype(ml_dtypes.bfloat16))
        client.infer("bf16_onnx", [tensor])
    return len(ROWS) + 2


def replay(logged: Logged, model: str, version: int, *more: str, source: Path | None = None) -> Result:
    log = logged.log if source is None else source
    args = ["replay", str(log), "--url", logged.gateway.http_url, "--model", model, "--version", str(version)]
    result = CliRunner().invoke(switchyard, [*args, "--json", *more], env={"SWITCHYARD_API_KEY": None})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


@pytest.mark.slow  # a gateway on real ports
def test_bf16_requests_with_nan_and_infinities_replay_as_they_were_answered(logged: Logged) -> None:
    result = replay(logged, "bf16_onnx", 1)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["records"], report["compared"], report["skipped"]) == (2, 2, {})
    assert report["outputs"]["y"]["values_off"] == 0
    assert report["outputs"]["f"]["values_off"] == 0


@pytest.mark.slow  # a gateway on real ports
def test_class_counts_of_a_version_that_differs_in_the_last_digits_pass_within_the_tolerances(logged: Logged) -> None:
    """A class count answers its scores as text; version 2's differ from version 1's by 5e-4 relative, its classes
    are the same: within the tolerances it passes, beyond them it fails."""
    within = replay(logged, "scores", 2, "--atol", "1e-2", "--rtol", "1e-2")
    assert within.exit_code == 0, within.output
    report = json.loads(within.stdout)
    assert (report["compared"], report["differing"]) == (len(ROWS), 0)
    assert report["outputs"]["scores"]["max_abs_diff"] > 0  # the versions do differ, within the tolerances
    beyond = replay(logged, "scores", 2, "--atol", "0", "--rtol", "0")
    assert beyond.exit_code == 1, beyond.output
    assert json.loads(beyond.stdout)["differing"] == len(ROWS)


@pytest.mark.slow  # a gateway on real ports
def test_a_model_or_version_the_gateway_does_not_serve_is_one_error_line_with_its_reason(logged: Logged) -> None:
    absent = replay(logged, "absent", 1)
    assert absent.exit_code == 2
    assert absent.stdout == ""
    assert "model 'absent' version 1 is not ready" in absent.stderr
    assert "the gateway serves no model 'absent': check --model and --url" in absent.stderr
    assert "switchyard models load" not in absent.stderr  # there is nothing to load
    unknown = replay(logged, "scores", 9)
    assert unknown.exit_code == 2
    assert "'scores' version 9 is not found; loaded versions: 1, 2" in unknown.stderr  # the gateway's own reason
    assert "load it first: switchyard models load scores 9" in unknown.stderr



@pytest.mark.slow  # a gateway on real ports
def test_a_record_the_gateway_was_killed_while_writing_is_skipped_with_a_warning(
    logged: Logged, tmp_path: Path
) -> None:
    """The file a killed gateway was writing ends in half a record; the restarted one writes a new file."""
    folder = tmp_path / "log"
    shutil.copytree(logged.log, folder)
    cut = folder / "inference-20000101T000000000000.jsonl"
    cut.write_text('{"format": 1, "id": "cut", "model": "sco')
    result = replay(logged, "scores", 1, source=folder)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["compared"] == len(ROWS)
    warning = f"warning: {cut}, line 1: a record cut short (the gateway stopped while writing it); skipped\n"
    assert result.stderr == warning


@pytest.mark.slow  # a gateway on real ports
def test_a_log_whose_records_all_lost_their_inputs_cannot_run_and_says_which_setting_keeps_them(
    logged: Logged, tmp_path: Path
) -> None:
    """Nothing sent is nothing compared: not a difference (exit 1) but a replay that could not run (exit 2)."""
    folder = tmp_path / "log"
    folder.mkdir()
    lines = []
    for path in sorted(logged.log.glob("inference-*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["model"] == "scores":  # as a record over the size cap is written: its tensors lose their values
                for tensor in record["request"]["inputs"]:
                    tensor.pop("data")
                    tensor["truncated"] = True
                record["truncated"] = True
                lines.append(json.dumps(record) + "\n")
    (folder / "inference-20261205T060000000000.jsonl").write_text("".join(lines))
    result = replay(logged, "scores", 1, source=folder)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.startswith(
        f"error: none of the {len(ROWS)} logged requests of model 'scores' in {folder} could be sent again "
        f"({len(ROWS)} inputs not in the log: inputs truncated); "
    )
    assert "SWITCHYARD_INFERENCE_LOG_MAX_RECORD_BYTES" in result.stderr


@pytest.mark.slow  # a gateway on real ports
def test_shadow_copies_in_the_log_are_not_compared_with_the_version_replayed(tmp_path: Path) -> None:
    """``scores`` version 2 stable, version 1 shadowing every request: the log holds each request twice, the client's
    answer (version 2) and the shadow's (version 1, never sent). Version 2 replayed answers as the clients got."""
    write_scores_model(tmp_path / "repository")
    log = tmp_path / "log"
    settings = Settings(repository=tmp_path / "repository", port=0, grpc_port=None, inference_log=f"file://{log}",
                        admin_token=SecretStr(TOKEN))
    with running_gateway(settings) as gateway:
        shadow = httpx.put(f"http://{gateway.http_url}/admin/models/scores/shadow", json={"version": 1, "percent": 100},
                           headers={"Authorization": f"Bearer {TOKEN}"})
        assert shadow.status_code == 200, shadow.text
        client = httpclient.InferenceServerClient(gateway.http_url)
        for rows in ROWS:
            tensor = httpclient.InferInput("x", list(rows.shape), "FP32")
            tensor.set_data_from_numpy(rows)
            client.infer("scores", [tensor])
        deadline = time.monotonic() + 30
        while gateway.metric("switchyard_inference_log_records_total") < 2 * len(ROWS):
            assert time.monotonic() < deadline, "the inference log did not write the requests' and shadows' records"
            time.sleep(0.05)
        result = replay(Logged(gateway, log), "scores", 2)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["records"], report["compared"], report["differing"]) == (2 * len(ROWS), len(ROWS), 0)
    assert report["skipped"] == {SHADOW_COPY: len(ROWS)}
