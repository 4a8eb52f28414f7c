"""``activate --verify-replay`` through the admin API of the real app (scripted backend, in process): a version
whose answers differ from the log is refused (422, the report in the answer, the routing unchanged, the version
unloaded again), one that answers as logged is activated with the report in its answer; a log the gateway cannot
read refuses too. The records are the gateway's own answers, written with ``format.encode_tensor``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry

from services.gateway.app import create_app
from services.gateway.settings import Settings
from services.inferlog.format import encode_tensor
from tests.gateway.scripted_backend import ScriptedBackend, double_repository
from tests.redis_server import redis_server

TOKEN = "replay-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
ROWS = [[0.5, -1.0, 2.0, 0.25], [1.0, 2.0, 3.0, 4.0], [-0.5, 0.0, 0.75, 8.0]]


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, ScriptedBackend]]:
    """``double`` version 1 stable; version 2 answers y 1.5 times larger (``factor``)."""
    backend = ScriptedBackend(factor={2: 1.5})
    settings = Settings(
        repository=double_repository(tmp_path / "repository"), state_path=tmp_path / "state" / "routing.json",
        grpc_port=None, repository_poll_s=0, admin_token=TOKEN,  # type: ignore[arg-type]
    )
    app = create_app(settings, backend=backend, registry=CollectorRegistry())
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            yield http, backend


async def record_log(http: httpx.AsyncClient, version: int, folder: Path, rows: list[list[float]] = ROWS) -> Path:
    """Each of ``rows`` sent to ``version`` (pinned) and written as one record of an inference log directory."""
    lines = []
    for number, row in enumerate(rows):
        x = np.array([row], dtype=np.float32)
        body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": row}]}
        answer = await http.post(f"/v2/models/double/versions/{version}/infer", json=body)
        assert answer.status_code == 200, answer.text
        outputs = [
            encode_tensor(o["name"], o["datatype"], np.array(o["data"], dtype=np.float32).reshape(o["shape"]))
            for o in answer.json()["outputs"]
        ]
        lines.append({
            "format": 1, "id": f"v{version}-{number}", "trace_id": None, "time": "2026-12-05T06:01:02.000000Z",
            "model": "double", "version": version, "route": "pinned", "protocol": "http", "latency_ms": 1.5,
            "status": 200, "error": None, "truncated": False, "redacted": [],
            "request": {"inputs": [encode_tensor("x", "FP32", x)], "outputs": None}, "response": {"outputs": outputs},
        })
    folder.mkdir(parents=True)
    (folder / "inference-20261205T060102000000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return folder


async def activate(http: httpx.AsyncClient, version: int, **verify_replay: Any) -> httpx.Response:
    body = {"verify_replay": verify_replay}
    return await http.post(f"/admin/models/double/versions/{version}/activate", json=body, headers=ADMIN)


async def stable(http: httpx.AsyncClient) -> int:
    status = (await http.get("/admin/models/double", headers=ADMIN)).json()
    return int(status["routing"]["stable"])


async def test_replay_check_refuses_a_version_that_answers_otherwise_and_accepts_one_that_answers_as_logged(
    gateway: tuple[httpx.AsyncClient, ScriptedBackend], tmp_path: Path
) -> None:
    http, backend = gateway
    v1_log = await record_log(http, 1, tmp_path / "v1-log")
    assert (await http.post("/admin/models/double/versions/2/load", headers=ADMIN)).status_code == 200
    v2_log = await record_log(http, 2, tmp_path / "v2-log")
    assert (await http.post("/admin/models/double/versions/2/unload", headers=ADMIN)).status_code == 200

    refused = await activate(http, 2, source=str(v1_log))
    assert refused.status_code == 422, refused.text
    answer = refused.json()
    assert answer["step"] == "replay"
    assert "3 of 3 logged answers differed" in answer["error"]
    assert "'replay' field" in answer["error"]
    assert answer["replay"]["passed"] is False
    assert answer["replay"]["differing"] == 3
    assert answer["replay"]["outputs"]["y"]["answers_off"] == 3
    assert answer["replay"]["outputs"]["z"]["values_off"] == 0
    assert await stable(http) == 1
    assert 2 not in backend.states  # the action loaded it, so the refusal unloaded it again
    status = (await http.get("/admin/models/double", headers=ADMIN)).json()
    assert status["last_replay"]["passed"] is False
    assert status["last_action"]["replay"]["differing"] == 3

    accepted = await activate(http, 2, source=f"file://{v2_log}", limit=2, atol=0, rtol=1e-6)
    assert accepted.status_code == 200, accepted.text
    report = accepted.json()
    assert report["result"] == "ok"
    assert "replay" in report["steps"]
    assert report["replay"]["passed"] is True
    assert report["replay"]["compared"] == 2
    assert await stable(http) == 2
    status = (await http.get("/admin/models/double", headers=ADMIN)).json()
    assert status["last_replay"]["passed"] is True


async def test_a_log_the_gateway_cannot_read_or_a_bad_option_refuses_and_changes_nothing(
    gateway: tuple[httpx.AsyncClient, ScriptedBackend], tmp_path: Path
) -> None:
    http, _ = gateway
    missing = await activate(http, 2, source=str(tmp_path / "nowhere"))
    assert missing.status_code == 422, missing.text
    assert "the replay source cannot be read" in missing.json()["error"]
    assert "does not exist" in missing.json()["error"]
    (tmp_path / "empty").mkdir()
    empty = await activate(http, 2, source=str(tmp_path / "empty"))
    assert empty.status_code == 422
    assert "holds no record of model 'double'" in empty.json()["error"]
    assert await stable(http) == 1
    bad = await activate(http, 2, source=str(tmp_path), limit=0)
    assert bad.status_code == 400
    assert "'verify_replay.limit' must be a whole number" in bad.json()["error"]
    unknown = await activate(http, 2, path=str(tmp_path))
    assert unknown.status_code == 400
    assert "unknown field(s) path" in unknown.json()["error"]


async def test_a_version_that_fails_every_logged_request_is_refused_naming_the_statuses(
    gateway: tuple[httpx.AsyncClient, ScriptedBackend], tmp_path: Path
) -> None:
    """Every request was sent and answered, with another status: not "none could be sent again"."""
    http, backend = gateway
    v1_log = await record_log(http, 1, tmp_path / "v1-log", rows=[row for row in ROWS if row[0] > 0])
    backend.failing_when_positive = {2}  # its warm-up (zeros) passes, every logged request fails
    refused = await activate(http, 2, source=str(v1_log))
    assert refused.status_code == 422, refused.text
    answer = refused.json()
    expected = "2 of 2 logged answers differed (0 beyond atol 1e-05 / rtol 0.0001, 2 with another status)"
    assert expected in answer["error"]
    assert answer["replay"]["status_mismatches"] == 2
    assert await stable(http) == 1


@pytest.mark.slow  # starts redis-server
async def test_a_redis_sources_password_stays_out_of_the_answer_the_admin_api_and_the_audit_log(
    gateway: tuple[httpx.AsyncClient, ScriptedBackend], tmp_path: Path
) -> None:
    """The report names its source; a Redis URL's password must not follow it into the audit log (a file here),
    the model's ``last_replay`` (read-only tokens read it) or the action's answer."""
    http, _ = gateway
    password = "replay-redis-password-9d41c7"
    v1_log = await record_log(http, 1, tmp_path / "v1-log")
    with redis_server(tmp_path / "redis") as server:
        client = redis.Redis.from_url(server.url)
        for line in (v1_log / "inference-20261205T060102000000.jsonl").read_text().splitlines():
            client.xadd("switchyard:log", {"record": line})
        client.config_set("requirepass", password)
        client.close()
        source = f"redis://:{password}@127.0.0.1:{server.port}/0?stream=switchyard:log"
        refused = await activate(http, 2, source=source)
    assert refused.status_code == 422, refused.text
    assert refused.json()["replay"]["records"] == 3  # it did read the stream
    expected = f"redis://:<password>@127.0.0.1:{server.port}/0?stream=switchyard:log"
    assert refused.json()["replay"]["source"] == expected
    model = (await http.get("/admin/models/double", headers=ADMIN)).text
    events = (await http.get("/admin/models/double/events", headers=ADMIN)).text
    assert expected in model
    assert expected in events
    audit = "".join(path.read_text() for path in (tmp_path / "state").rglob("*") if path.is_file())
    assert "replay" in audit
    for shown in (refused.text, model, events, audit):
        assert password not in shown
