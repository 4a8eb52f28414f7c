"""``switchyard replay`` and ``switchyard models activate --verify-replay`` against the real app on a real port
(scripted backend: ``double``, whose version 2 answers y 1.5 times larger than version 1): a log recorded on a
version replays on it without a difference (exit 0) and on the other with differences (exit 1); what cannot run
is one ``error:`` line and exit 2."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import uvicorn
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner, Result

from services.cli import app as switchyard
from services.gateway.app import create_app
from services.gateway.server import uvicorn_config
from services.gateway.settings import Settings
from services.inferlog.format import encode_tensor
from tests.gateway.scripted_backend import ScriptedBackend, double_repository
from tests.slow_work import slow_work

TOKEN = "replay-cli-admin-token"
ROWS = [[0.5, -1.0, 2.0, 0.25], [1.0, 2.0, 3.0, 4.0], [-0.5, 0.0, 0.75, 8.0], [3.0, 1.0, -2.0, 0.5]]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The gateway's URL: ``double`` version 1 stable, version 2 loaded beside it."""
    slow_work("starts a gateway on a real port")
    folder = tmp_path_factory.mktemp("replay-gateway")
    settings = Settings(
        repository=double_repository(folder / "repository"), state_path=folder / "state" / "routing.json",
        port=0, grpc_port=None, repository_poll_s=0, admin_token=TOKEN,  # type: ignore[arg-type]
    )
    app = create_app(settings, backend=ScriptedBackend(factor={2: 1.5}), registry=CollectorRegistry())
    server = uvicorn.Server(uvicorn_config(settings, app, log_level="warning"))
    thread = threading.Thread(target=server.run, name="replay-gateway", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the gateway did not start (see its log above)")
        time.sleep(0.05)
    url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    loaded = httpx.post(f"{url}/admin/models/double/versions/2/load", headers={"Authorization": f"Bearer {TOKEN}"})
    assert loaded.status_code == 200, loaded.text
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def logs(gateway: str, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """An inference log directory per version: ROWS sent to it (pinned), one record each, over two files."""
    folders = {}
    for version in (1, 2):
        records = []
        for number, row in enumerate(ROWS):
            body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": row}]}
            answer = httpx.post(f"{gateway}/v2/models/double/versions/{version}/infer", json=body)
            assert answer.status_code == 200, answer.text
            outputs = [
                encode_tensor(o["name"], "FP32", np.array(o["data"], dtype=np.float32).reshape(o["shape"]))
                for o in answer.json()["outputs"]
            ]
            records.append({
                "format": 1, "id": f"v{version}-{number}", "trace_id": None, "time": "2026-12-05T06:01:02.000000Z",
                "model": "double", "version": version, "route": "pinned", "protocol": "http", "latency_ms": 1.5,
                "status": 200, "error": None, "truncated": False, "redacted": [],
                "request": {"inputs": [encode_tensor("x", "FP32", np.array([row], dtype=np.float32))],
                            "outputs": ["y"] if number == 0 else None},
                "response": {"outputs": outputs[:1] if number == 0 else outputs},
            })
        folder = tmp_path_factory.mktemp(f"log-v{version}")
        for half, name in ((records[:2], "20261205T060000000000"), (records[2:], "20261205T070000000000")):
            (folder / f"inference-{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in half))
        folders[version] = folder
    return folders


def run(*args: str) -> Result:
    result = CliRunner().invoke(switchyard, list(args), env={"SWITCHYARD_API_KEY": None})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result


def replay(gateway: str, source: Path | str, version: int, *more: str) -> Result:
    return run("replay", str(source), "--url", gateway, "--model", "double", "--version", str(version), *more)


@pytest.mark.slow  # a gateway on a real port
def test_a_log_replayed_on_the_version_that_answered_it_has_no_difference(gateway: str, logs: dict[int, Path]) -> None:
    result = replay(gateway, logs[2], 2, "--json", "--rate", "200")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["passed"] is True
    assert report["compared"] == 4
    assert report["differing"] == 0
    assert report["outputs"]["y"]["compared"] == 4
    assert report["outputs"]["z"]["compared"] == 3
    assert report["latency_ms"]["new"]["count"] == 4


@pytest.mark.slow  # a gateway on a real port
def test_a_log_replayed_on_another_version_reports_the_differences_and_exits_1(
    gateway: str, logs: dict[int, Path]
) -> None:
    result = replay(gateway, f"file://{logs[2]}", 1, "--limit", "3")
    assert result.exit_code == 1, result.output
    assert "replay of model 'double' on version 1: FAILED" in result.stdout
    assert "3 records: 3 compared, 0 on status only, 0 skipped" in result.stdout
    assert "3 beyond atol 1e-05 / rtol 0.0001, 0 with another status" in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= 80


@pytest.mark.slow  # a gateway on a real port
def test_what_cannot_run_is_one_error_line_and_exit_2(gateway: str, logs: dict[int, Path], tmp_path: Path) -> None:
    missing = replay(gateway, tmp_path / "nowhere", 2)
    assert missing.exit_code == 2
    assert missing.stderr.startswith("error: inference log directory")
    assert missing.stdout == ""
    unserved = replay(gateway, logs[2], 3)
    assert unserved.exit_code == 2
    assert "version 3 is not ready" in unserved.stderr
    other = run("replay", str(logs[2]), "--url", gateway, "--model", "absent", "--version", "1")
    assert other.exit_code == 2
    assert "is not ready" in other.stderr
    (tmp_path / "empty").mkdir()
    empty = replay(gateway, tmp_path / "empty", 2)
    assert empty.exit_code == 2
    assert "holds no record of model 'double'" in empty.stderr


@pytest.mark.slow  # a gateway on a real port
def test_models_activate_verify_replay_refuses_then_accepts(gateway: str, logs: dict[int, Path]) -> None:
    """Runs last in the module: it changes the stable version."""
    common = ["--url", gateway, "--token", TOKEN]
    refused = run("models", "activate", "double", "2", "--verify-replay", str(logs[1]), *common)
    assert refused.exit_code == 1, refused.output
    assert "failed at step 'replay'" in refused.stderr
    assert "4 of 4 logged answers differed" in refused.stderr
    assert "replay of model 'double' on version 2: FAILED" in refused.stderr
    accepted = run("models", "activate", "double", "2", "--verify-replay", str(logs[2]), "--replay-limit", "2",
                   "--json", *common)
    assert accepted.exit_code == 0, accepted.output
    answer = json.loads(accepted.stdout)
    assert answer["result"] == "ok"
    assert answer["replay"]["passed"] is True
    assert answer["replay"]["compared"] == 2
