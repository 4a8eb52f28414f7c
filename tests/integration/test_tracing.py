"""Traces and the inference log end to end, on the embedded backend with the example models: one gateway (real ports)
exporting to an OTLP/HTTP receiver the test runs and logging every request to a JSON-lines folder.

The sampler records no trace the gateway starts itself (``parentbased_traceidratio`` at 0): what is recorded is
what a caller asked for with a sampled ``traceparent``, which is always honoured."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from typer.testing import CliRunner

from examples import models
from services.cli import app as switchyard
from services.gateway.settings import Settings
from services.inferlog.format import inputs_of, outputs_of
from tests.gateway_harness import RunningGateway, running_gateway
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan, otlp_receiver

SERVER, CLIENT = 2, 3  # OTLP span kinds
TOKEN = "tracing-test-token"


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with otlp_receiver() as running:
        yield running


@pytest.fixture(scope="module")
def log_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("inference-log")


@pytest.fixture(scope="module")
def gateway(example_repository: Path, receiver: OtlpReceiver, log_folder: Path) -> Iterator[RunningGateway]:
    environment = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_SERVICE_NAME": "gateway-under-test",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    settings = Settings(
        repository=example_repository, port=0, grpc_port=0, inference_log=f"file://{log_folder}",
        inference_log_sample=1.0, admin_token=TOKEN,
    )
    with mock.patch.dict(os.environ, environment), running_gateway(settings) as running:
        yield running


def traceparent(trace_id: str, span_id: str = "00f067aa0ba902b7", sampled: bool = True) -> str:
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}"


def sampled(header: str) -> bool:
    """The W3C sampled bit of a ``traceparent`` (other bits, such as level 2's random flag, may be set)."""
    return bool(int(header.rsplit("-", 1)[1], 16) & 1)


def features(rows: int = 1) -> np.ndarray:
    return models.mlp_inputs(rows, seed=3).numpy()


def trace_of(receiver: OtlpReceiver, trace_id: str, names: set[str]) -> dict[str, ReceivedSpan]:
    spans = receiver.wait_for(lambda got: names <= {s.name for s in got if s.trace_id == trace_id}, timeout_s=10)
    return {span.name: span for span in spans if span.trace_id == trace_id}


@pytest.mark.slow
def test_http_request_with_a_sampled_parent_is_traced_stage_by_stage_and_its_answer_names_the_span(
    gateway: RunningGateway, receiver: OtlpReceiver
) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    body = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 32], "data": features().ravel().tolist()}]}
    answer = httpx.post(
        f"http://{gateway.http_url}/v2/models/mlp/infer", json=body, headers={"traceparent": traceparent(trace_id)}
    )
    assert answer.status_code == 200, answer.text
    version, trace, span_id, flags = answer.headers["traceparent"].split("-")
    assert (version, trace) == ("00", trace_id)
    assert sampled(answer.headers["traceparent"])

    spans = trace_of(receiver, trace_id, {"POST /v2/models/{model_name}/infer", "batch queue", "execute"})
    server = spans["POST /v2/models/{model_name}/infer"]
    assert server.span_id == span_id
    assert server.parent_span_id == "00f067aa0ba902b7"
    assert server.kind == SERVER
    assert server.service == "gateway-under-test"
    assert server.attributes["switchyard.model"] == "mlp"
    assert server.attributes["switchyard.version"] == 2
    assert server.attributes["switchyard.route"] == "stable"
    assert server.attributes["switchyard.outcome"] == "ok"
    for stage in ("batch queue", "execute"):
        child = spans[stage]
        assert child.parent_span_id == server.span_id
        assert server.start_ns <= child.start_ns <= child.end_ns <= server.end_ns
        assert child.attributes["switchyard.batch_size"] >= 1
    assert spans["batch queue"].end_ns <= spans["execute"].start_ns


@pytest.mark.slow
def test_grpc_request_with_a_sampled_parent_is_traced_and_its_initial_metadata_names_the_span(
    gateway: RunningGateway, receiver: OtlpReceiver
) -> None:
    trace_id = "5cf92f3577b34da6a3ce929d0e0e4736"
    client = grpcclient.InferenceServerClient(gateway.grpc_url)
    tensor = grpcclient.InferInput("features", [1, 32], "FP32")
    tensor.set_data_from_numpy(features())
    pinned = client.infer("mlp", [tensor], model_version="1", headers={"traceparent": traceparent(trace_id)})
    assert pinned.get_response().model_version == "1"
    spans = trace_of(receiver, trace_id, {"inference.GRPCInferenceService/ModelInfer", "execute"})
    server = spans["inference.GRPCInferenceService/ModelInfer"]
    assert server.parent_span_id == "00f067aa0ba902b7"
    assert server.attributes["switchyard.route"] == "pinned"
    assert server.attributes["switchyard.version"] == 1
    assert spans["execute"].parent_span_id == server.span_id


@pytest.mark.slow
def test_unsampled_requests_record_nothing_but_still_carry_their_traceparent(
    gateway: RunningGateway, receiver: OtlpReceiver
) -> None:
    trace_id = "6df92f3577b34da6a3ce929d0e0e4736"
    body = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 32], "data": features().ravel().tolist()}]}
    url = f"http://{gateway.http_url}/v2/models/mlp/infer"
    unparented = httpx.post(url, json=body)
    declined = httpx.post(url, json=body, headers={"traceparent": traceparent(trace_id, sampled=False)})
    marker = "7ef92f3577b34da6a3ce929d0e0e4736"  # a sampled request after them: once it arrived, they would have too
    httpx.post(url, json=body, headers={"traceparent": traceparent(marker)})
    trace_of(receiver, marker, {"POST /v2/models/{model_name}/infer"})
    assert not sampled(unparented.headers["traceparent"])
    assert declined.headers["traceparent"].split("-")[1] == trace_id
    assert not sampled(declined.headers["traceparent"])
    recorded = {span.trace_id for span in receiver.spans()}
    assert trace_id not in recorded
    assert unparented.headers["traceparent"].split("-")[1] not in recorded


@pytest.mark.slow
def test_refused_request_is_traced_with_its_status_and_reason(gateway: RunningGateway, receiver: OtlpReceiver) -> None:
    trace_id = "8af92f3577b34da6a3ce929d0e0e4736"
    body = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16], "data": [0.0] * 16}]}
    answer = httpx.post(
        f"http://{gateway.http_url}/v2/models/mlp/infer", json=body, headers={"traceparent": traceparent(trace_id)}
    )
    assert answer.status_code == 400
    assert answer.headers["traceparent"].split("-")[1] == trace_id
    server = trace_of(receiver, trace_id, {"POST /v2/models/{model_name}/infer"})["POST /v2/models/{model_name}/infer"]
    assert server.attributes["switchyard.status"] == 400
    assert server.attributes["switchyard.outcome"] == "rejected"
    assert server.attributes["switchyard.rejection"] == "invalid"


@pytest.mark.slow
def test_openmetrics_scrape_shows_the_trace_ids_of_recorded_requests_as_exemplars(
    gateway: RunningGateway, receiver: OtlpReceiver
) -> None:
    trace_id = "9bf92f3577b34da6a3ce929d0e0e4736"
    body = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 32], "data": features().ravel().tolist()}]}
    httpx.post(
        f"http://{gateway.http_url}/v2/models/mlp/infer", json=body, headers={"traceparent": traceparent(trace_id)}
    ).raise_for_status()
    scrape = httpx.get(
        f"http://{gateway.http_url}/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert scrape.headers["content-type"].startswith("application/openmetrics-text")
    lines = [line for line in scrape.text.splitlines() if line.startswith("switchyard_request_duration_seconds_bucket")]
    assert any(f'# {{trace_id="{trace_id}"}}' in line for line in lines), lines[:5]
    plain = httpx.get(f"http://{gateway.http_url}/metrics")
    assert plain.headers["content-type"].startswith("text/plain")
    assert "trace_id" not in plain.text


@pytest.mark.slow
def test_inference_log_keeps_a_record_of_every_request_with_failures_and_binary_inputs_decoded(
    gateway: RunningGateway, log_folder: Path
) -> None:
    """1,000 requests at sample 1.0: 1,000 records (over HTTP JSON, HTTP binary and gRPC), the refused ones too."""
    before = _records(log_folder)
    http = httpclient.InferenceServerClient(gateway.http_url, concurrency=4)
    grpc = grpcclient.InferenceServerClient(gateway.grpc_url)
    sent: list[np.ndarray] = []
    for index in range(990):
        data = models.mlp_inputs(1, seed=index).numpy()
        sent.append(data)
        if index % 2:
            tensor = httpclient.InferInput("features", [1, 32], "FP32")
            tensor.set_data_from_numpy(data, binary_data=True)
            http.infer("mlp", [tensor])
        else:
            tensor = grpcclient.InferInput("features", [1, 32], "FP32")
            tensor.set_data_from_numpy(data)
            grpc.infer("mlp", [tensor])
    wrong = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16], "data": [0.0] * 16}]}
    for _ in range(10):
        assert httpx.post(f"http://{gateway.http_url}/v2/models/mlp/versions/1/infer", json=wrong).status_code == 400
    records = _wait_for_records(log_folder, len(before) + 1000)[len(before):]
    assert len(records) == 1000
    served = [record for record in records if record["status"] == 200]
    failed = [record for record in records if record["status"] == 400]
    assert len(served) == 990
    assert len(failed) == 10
    for record, data in zip(served, sent, strict=True):
        assert record["model"] == "mlp"
        assert record["version"] == 2
        assert record["route"] == "stable"
        [(name, datatype, values)] = inputs_of(record)
        assert (name, datatype) == ("features", "FP32")
        np.testing.assert_array_equal(values, data)
        assert set(outputs_of(record)) == {"logits", "probabilities"}
    assert {record["protocol"] for record in served} == {"http", "grpc"}
    assert all(record["response"] is None and "Expected [-1,32]" in record["error"] for record in failed)
    assert all(record["route"] == "pinned" and record["version"] == 1 for record in failed)
    assert len({record["id"] for record in records}) == 1000


@pytest.mark.slow
def test_shadow_call_is_a_trace_of_its_own_linked_to_the_request_it_copies(
    gateway: RunningGateway, receiver: OtlpReceiver
) -> None:
    url = f"http://{gateway.http_url}"
    admin = {"Authorization": f"Bearer {TOKEN}"}
    body = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 32], "data": features().ravel().tolist()}]}
    trace_id = "ab" * 16
    httpx.put(f"{url}/admin/models/mlp/shadow", headers=admin, json={"version": 1, "percent": 100}).raise_for_status()
    try:
        httpx.post(f"{url}/v2/models/mlp/infer", json=body, headers={"traceparent": traceparent(trace_id)})
        spans = receiver.wait_for(
            lambda got: any(s.name == "shadow infer" and s.links and s.links[0][0] == trace_id for s in got)
        )
    finally:
        httpx.put(f"{url}/admin/models/mlp/shadow", headers=admin, json={"version": None}).raise_for_status()
    server = trace_of(receiver, trace_id, {"POST /v2/models/{model_name}/infer"})["POST /v2/models/{model_name}/infer"]
    shadow = next(span for span in spans if span.name == "shadow infer" and span.links[0][0] == trace_id)
    assert shadow.trace_id != trace_id
    assert shadow.parent_span_id == ""
    assert shadow.links == [(trace_id, server.span_id)]
    assert shadow.attributes["switchyard.version"] == 1
    assert shadow.attributes["switchyard.route"] == "shadow"
    execute = receiver.wait_for(lambda got: any(s.trace_id == shadow.trace_id and s.name == "execute" for s in got))
    assert [s.parent_span_id for s in execute if s.trace_id == shadow.trace_id and s.name == "execute"] == [
        shadow.span_id
    ]


@pytest.mark.slow
def test_replay_of_the_log_passes_on_the_version_that_answered_and_refuses_the_other(
    gateway: RunningGateway, log_folder: Path, tmp_path: Path
) -> None:
    """The gateway's log of what version 2 answered (the stable requests above, as the writer wrote them): replayed
    on version 2 it matches, on version 1 it differs (exit 1); an activation of version 1 verified against it is
    refused, of version 2 accepted."""
    gateway_log = log_folder
    recorded = tmp_path / "recorded-on-2"
    recorded.mkdir()
    lines = [line for path in sorted(log_folder.glob("inference-*.jsonl")) for line in path.read_text().splitlines()]
    kept = [line for line in lines if (record := json.loads(line))["version"] == 2 and record["status"] == 200]
    assert len(kept) >= 990
    (recorded / "inference-20261205T000000000000.jsonl").write_text("\n".join(kept) + "\n")
    log_folder = recorded
    url = f"http://{gateway.http_url}"
    logged_before = len(_records(gateway_log))
    replay = ["replay", str(log_folder), "--url", url, "--model", "mlp", "--limit", "200"]
    same = CliRunner().invoke(switchyard, [*replay, "--version", "2", "--json"])
    assert same.exit_code == 0, same.output
    assert json.loads(same.output)["passed"] is True
    # The replayed requests are not logged again (a marker request after them is: once it is there, they would be).
    body = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 32], "data": features().ravel().tolist()}]}
    httpx.post(f"{url}/v2/models/mlp/infer", json=body).raise_for_status()
    assert len(_wait_for_records(gateway_log, logged_before + 1)) == logged_before + 1
    other = CliRunner().invoke(switchyard, [*replay, "--version", "1"])
    assert other.exit_code == 1, other.output

    admin = ["models", "activate", "mlp", "--url", url, "--token", TOKEN, "--verify-replay", str(log_folder),
             "--replay-limit", "200"]
    refused = CliRunner().invoke(switchyard, [*admin[:3], "1", *admin[3:]])
    assert refused.exit_code == 1, refused.output
    stable = httpx.get(f"{url}/admin/models/mlp", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert stable["routing"]["stable"] == 2
    CliRunner().invoke(switchyard, ["models", "activate", "mlp", "1", "--url", url, "--token", TOKEN])
    accepted = CliRunner().invoke(switchyard, [*admin[:3], "2", *admin[3:]])
    assert accepted.exit_code == 0, accepted.output


@pytest.mark.slow
def test_generate_routes_with_a_sampled_parent_are_traced_and_answer_their_traceparent_but_are_not_logged(
    gateway: RunningGateway, receiver: OtlpReceiver, log_folder: Path
) -> None:
    url = f"http://{gateway.http_url}/v2/models/mlp"
    body = {"features": features().ravel().tolist()}
    traces = {"generate": "c1" * 16, "generate_stream": "c2" * 16}
    answers = {
        route: httpx.post(f"{url}/{route}", json=body, headers={"traceparent": traceparent(trace_id)})
        for route, trace_id in traces.items()
    }
    for route, trace_id in traces.items():
        answer = answers[route]
        assert answer.status_code == 200, answer.text
        _, trace, span_id, _ = answer.headers["traceparent"].split("-")
        assert trace == trace_id
        assert sampled(answer.headers["traceparent"])
        name = f"POST /v2/models/{{model_name}}/{route}"
        spans = trace_of(receiver, trace_id, {name, "execute"})
        server = spans[name]
        assert (server.span_id, server.parent_span_id, server.kind) == (span_id, "00f067aa0ba902b7", SERVER)
        assert server.attributes["switchyard.model"] == "mlp"
        assert server.attributes["switchyard.outcome"] == "ok"
        assert spans["execute"].parent_span_id == server.span_id
    assert answers["generate_stream"].text.startswith("data: ")
    # Not logged: a marker /infer request after them is, and once it is there they would have been too.
    marker = "c3" * 16
    infer = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 32], "data": body["features"]}]}
    httpx.post(f"{url}/infer", json=infer, headers={"traceparent": traceparent(marker)}).raise_for_status()
    records = _wait_for_trace_records(log_folder, {marker})
    assert not {record["trace_id"] for record in records} & set(traces.values())


@pytest.mark.slow
def test_replay_of_a_classification_and_of_requests_refused_for_their_parameters_matches_on_their_version(
    gateway: RunningGateway, log_folder: Path, tmp_path: Path
) -> None:
    """Records keep the class count and the request parameters: replayed on the version that answered them (with
    ``switchyard replay`` and an activation's check) they answer alike, the 504 and the 400 included."""
    url = f"http://{gateway.http_url}"
    data = features().ravel().tolist()
    inputs = [{"name": "features", "datatype": "FP32", "shape": [1, 32], "data": data}]
    asked = {
        "d1" * 16: ({"inputs": inputs, "outputs": [{"name": "logits", "parameters": {"classification": 2}}]}, 200),
        "d2" * 16: ({"inputs": inputs, "parameters": {"timeout": 1}}, 504),
        "d3" * 16: ({"inputs": inputs, "parameters": {"temperature": 0.5}}, 400),
    }
    for trace_id, (body, status) in asked.items():
        answer = httpx.post(f"{url}/v2/models/mlp/versions/2/infer", json=body,
                            headers={"traceparent": traceparent(trace_id, sampled=False)})
        assert answer.status_code == status, answer.text
    records = _wait_for_trace_records(log_folder, set(asked))
    recorded = tmp_path / "asked-of-2"
    recorded.mkdir()
    (recorded / "inference-20261206T000000000000.jsonl").write_text(
        "\n".join(json.dumps(record) for record in records if record["trace_id"] in asked) + "\n"
    )
    replay = CliRunner().invoke(switchyard, ["replay", str(recorded), "--url", url, "--model", "mlp", "--version", "2",
                                             "--json"])
    assert replay.exit_code == 0, replay.output
    report = json.loads(replay.output)
    assert (report["compared"], report["status_only"], report["status_mismatches"]) == (1, 2, 0)

    admin = ["--url", url, "--token", TOKEN]
    assert CliRunner().invoke(switchyard, ["models", "activate", "mlp", "1", *admin]).exit_code == 0
    checked = CliRunner().invoke(
        switchyard, ["models", "activate", "mlp", "2", *admin, "--verify-replay", str(recorded)]
    )
    assert checked.exit_code == 0, checked.output
    model = httpx.get(f"{url}/admin/models/mlp", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert (model["last_replay"]["compared"], model["last_replay"]["status_only"]) == (1, 2)


def _records(folder: Path) -> list[dict[str, object]]:
    lines = [line for path in sorted(folder.glob("inference-*.jsonl")) for line in path.read_text().splitlines()]
    return [json.loads(line) for line in lines if line]


def _wait_for_records(folder: Path, count: int) -> list[dict[str, object]]:
    import time

    deadline = time.monotonic() + 20
    while True:
        records = _records(folder)
        if len(records) >= count or time.monotonic() > deadline:
            return records
        time.sleep(0.05)



def _wait_for_trace_records(folder: Path, trace_ids: set[str]) -> list[dict[str, object]]:
    """The log's records once one of each trace id in ``trace_ids`` is there."""
    import time

    deadline = time.monotonic() + 20
    while True:
        records = _records(folder)
        if trace_ids <= {record["trace_id"] for record in records} or time.monotonic() > deadline:
            return records
        time.sleep(0.05)
