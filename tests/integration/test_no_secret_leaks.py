"""No secret leaves the gateway: after a run with API keys (the keys file's and the line setting's), admin tokens
(the setting's and the file's read-only and operator ones), wrong keys and tokens, refusals of every kind, traces
of every request and the inference log on, none of the secrets presented, right or wrong, is in the gateway's log
(at debug level), ``/metrics``, the exported spans, the inference log, the audit log or the keys file; and each of
those did record the run (so the scan looked at something)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from unittest import mock

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from examples import models
from services.keyfile.format import AdminEntry, KeyEntry, hash_secret, presented_admin_token, presented_key
from services.keyfile.writing import write_entries
from tests.gateway_process import gateway_process
from tests.otlp_receiver import otlp_receiver

SETTING_TOKEN = "setting-admin-token-5d1f0c"
LINE_KEY = "line-format-key-8e2b77"
TEAM = presented_key("team", "team-secret-3c9a41")
PACED = presented_key("paced", "paced-secret-71f0e2")
VIEWER = presented_admin_token("viewer", "viewer-secret-a4b8d0")
ONCALL = presented_admin_token("oncall", "oncall-secret-0b6c2e")
WRONG = [presented_key("team", "wrong-guess-66d1a9"), "sy_nobody_guess-9f4e1b", "plain-wrong-key-2a7c55",
         presented_admin_token("oncall", "wrong-admin-guess-e07b3d"), "wrong-setting-token-c81f96"]
SECRETS = [SETTING_TOKEN, LINE_KEY, TEAM, PACED, VIEWER, ONCALL, *WRONG,
           *(presented.rsplit("_", 1)[1] for presented in (TEAM, PACED, VIEWER, ONCALL))]
"""Every string a leak would show: the keys and tokens as presented, and the secret part of each."""


def write_keys(path: Path) -> None:
    def hashed(presented: str) -> tuple[str, ...]:
        return (hash_secret(presented.rsplit("_", 1)[1]),)

    write_entries(
        path,
        {"team": KeyEntry("team", hashed(TEAM), ("mlp",), None, "team", concurrency=4),
         "paced": KeyEntry("paced", hashed(PACED), ("mlp",), None, "paced", rps=0.2, burst=1)},
        {"viewer": AdminEntry("viewer", hashed(VIEWER), "read-only"),
         "oncall": AdminEntry("oncall", hashed(ONCALL), "operator")},
    )


def infer_body() -> dict[str, object]:
    rows = models.mlp_inputs(1, seed=5).numpy()
    return {"inputs": [{"name": "features", "shape": list(rows.shape), "datatype": "FP32",
                        "data": rows.ravel().tolist()}]}


@pytest.mark.slow
def test_no_secret_is_in_the_log_metrics_traces_inference_log_or_audit_log_after_a_run(
    example_repository: Path, tmp_path: Path
) -> None:
    keys_path, inference_log = tmp_path / "keys.toml", tmp_path / "inference-log"
    write_keys(keys_path)
    inference_log.mkdir()
    traffic_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    with otlp_receiver() as receiver:
        settings = {
            "api_keys_file": str(keys_path), "api_keys": f"{LINE_KEY}:lines", "log_level": "debug",
            "inference_log": f"file://{inference_log}",
        }
        # Every request traced, exported within 50 ms (gateway_process passes this environment on).
        tracing = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_TRACES_SAMPLER": "always_on",
                   "OTEL_BSP_SCHEDULE_DELAY": "50"}
        with (
            mock.patch.dict(os.environ, tracing),
            gateway_process(example_repository, tmp_path, token=SETTING_TOKEN, **settings) as gateway,
        ):
            statuses, answers = _run_traffic(gateway.http_url, gateway.grpc_url, traffic_id)
            metrics = httpx.get(f"http://{gateway.http_url}/metrics", timeout=10).text
        spans = receiver.wait_for(lambda got: any(s.trace_id == traffic_id for s in got), timeout_s=10)
        exported = "\n".join(receiver.payloads)

    log = (tmp_path / "gateway.log").read_text()
    logged = "\n".join(path.read_text() for path in sorted(inference_log.rglob("*")) if path.is_file())
    audit = "\n".join(path.read_text() for path in sorted((tmp_path / "state").glob("*events*")))
    keys_file = keys_path.read_text()

    assert statuses == {"ok": 3, "forbidden": 1, "unauthorized": 3, "rate_limited": 1, "admin_ok": 4,
                        "admin_refused": 3}
    places = {"gateway log": log, "/metrics": metrics, "spans": exported, "inference log": logged,
              "audit log": audit, "keys file": keys_file, "answers": answers}
    # Each place recorded the run: a scan of an empty file would prove nothing.
    assert "DEBUG" in log
    assert 'key="paced"' in metrics
    assert spans
    assert '"model"' in logged
    assert "admin:oncall" in audit
    assert "scrypt$" in keys_file
    leaks = [(secret, place) for secret in SECRETS for place, text in places.items() if secret in text]
    assert leaks == []


def _run_traffic(http_url: str, grpc_url: str, trace_id: str) -> tuple[dict[str, int], str]:
    """How many answers of each kind came, and every answer's headers and body as one text."""
    answers: list[str] = []
    body, statuses = infer_body(), dict.fromkeys(
        ("ok", "forbidden", "unauthorized", "rate_limited", "admin_ok", "admin_refused"), 0
    )
    traced = {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
    kinds = {200: "ok", 403: "forbidden", 401: "unauthorized", 429: "rate_limited"}
    with httpx.Client(base_url=f"http://{http_url}", timeout=30) as http:
        for key, model in [(TEAM, "mlp"), (LINE_KEY, "mlp"), (TEAM, "classifier"), (PACED, "mlp"), (PACED, "mlp"),
                           *((wrong, "mlp") for wrong in WRONG[:3])]:
            answer = http.post(f"/v2/models/{model}/infer", json=body, headers={"x-api-key": key, **traced})
            statuses[kinds[answer.status_code]] += 1
            answers.append(f"{answer.headers}\n{answer.text}")
        statuses["ok"] -= 1  # the first paced request passes; the grpc one below is counted apart
        client = grpcclient.InferenceServerClient(grpc_url)
        rows = np.asarray(body["inputs"][0]["data"], dtype=np.float32).reshape(1, -1)  # type: ignore[index]
        tensor = grpcclient.InferInput("features", list(rows.shape), "FP32")
        tensor.set_data_from_numpy(rows)
        client.infer("mlp", [tensor], headers={"x-api-key": TEAM, **traced})
        statuses["ok"] += 1
        for token, method, path in [(VIEWER, "GET", "/admin/whoami"), (ONCALL, "GET", "/admin/models"),
                                    (SETTING_TOKEN, "GET", "/admin/models/mlp/events"),
                                    (ONCALL, "PUT", "/admin/models/mlp/inference-log"),
                                    (VIEWER, "PUT", "/admin/models/mlp/inference-log"),
                                    (WRONG[3], "GET", "/admin/models"), (WRONG[4], "GET", "/admin/models")]:
            answer = http.request(method, path, json={"percent": 100} if method == "PUT" else None,
                                  headers={"authorization": f"Bearer {token}"})
            statuses["admin_ok" if answer.status_code == 200 else "admin_refused"] += 1
            answers.append(f"{answer.headers}\n{answer.text}")
    time.sleep(0.3)  # the inference log's writer and the span processor flush on their own schedule too
    return statuses, "\n".join(answers)
