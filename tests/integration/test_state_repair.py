"""A routing state that names versions the repository does not hold (issue #28, finding 5): a gateway started on it
serves what is on disk, and neither its routing nor the file it writes back carries a missing version forward; the
log and the audit log say what was dropped."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx
import pytest

from services.gateway.settings import Settings
from tests.gateway_harness import running_gateway

pytestmark = pytest.mark.slow  # a gateway on real ports

TOKEN = "state-repair-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
GONE = 99
"""Versions 1 and 2 of each model are on disk."""


def test_startup_drops_versions_not_on_disk_from_the_persisted_routing_when_the_record_names_them(
    repository: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "routing.json"
    state.write_text(json.dumps({"format": 1, "models": {
        # the probe's record: a stable version that is not on disk, and one to roll back to that is
        "mlp": {"stable": GONE, "previous": 1, "generation": 4},
        # a stable version on disk, with every other version it names gone
        "classifier": {"stable": 1, "previous": GONE, "generation": 7, "loaded": [1, GONE],
                       "canary": {"version": GONE, "weight": 10}, "shadow": {"version": GONE, "sample": 0.5}},
    }}))  # fmt: skip
    settings = Settings(repository=repository, state_path=state, port=0, grpc_port=0, repository_poll_s=0,
                        admin_token=TOKEN)  # type: ignore[arg-type]
    startup_log = caplog.at_level(logging.ERROR, logger="services.gateway.versions.startup")
    with startup_log, running_gateway(settings) as gateway:
        url = f"http://{gateway.http_url}"
        mlp = httpx.get(f"{url}/admin/models/mlp", headers=ADMIN).json()["routing"]
        classifier = httpx.get(f"{url}/admin/models/classifier", headers=ADMIN).json()["routing"]
        events = httpx.get(f"{url}/admin/models/classifier/events", headers=ADMIN).json()["events"]
        answer = httpx.post(f"{url}/v2/models/mlp/infer", json={"inputs": [
            {"name": "features", "datatype": "FP32", "shape": [1, 32], "data": [0.5] * 32}]})  # fmt: skip
    assert (mlp["stable"], mlp["previous"], mlp["generation"]) == (2, 1, 5)
    assert (answer.status_code, answer.json()["model_version"]) == (200, "2")
    assert (classifier["stable"], classifier["previous"], classifier["canary"], classifier["shadow"]) == (
        1, None, None, None
    )
    assert (classifier["loaded"], classifier["generation"]) == ([1], 8)
    persisted = json.loads(state.read_text())["models"]
    named = {name: _versions_named(record) for name, record in persisted.items()}
    assert all(GONE not in versions for versions in named.values()), named
    assert (persisted["mlp"], persisted["classifier"]) == (mlp, classifier)
    messages = [record.getMessage() for record in caplog.records]
    assert any(f"persisted stable version {GONE} is gone from the repository; serving version 2" in m
               for m in messages), messages  # fmt: skip
    dropped = f"previous version {GONE}, canary version {GONE}, shadow version {GONE}, loaded version {GONE}"
    assert any(dropped in m for m in messages), messages
    assert dropped in events[-1]["error"]


def _versions_named(record: dict[str, object]) -> set[object]:
    """Every version a persisted routing record names (a text search would also match its timestamp's digits)."""
    canary, shadow, loaded = record.get("canary"), record.get("shadow"), record.get("loaded") or []
    named = {record.get("stable"), record.get("previous"), *loaded}  # type: ignore[misc]
    named |= {policy.get("version") for policy in (canary, shadow) if isinstance(policy, dict)}
    return named
