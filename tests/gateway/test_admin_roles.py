"""Operator roles of the admin API: tokens of the keys file (``[admins.<id>]``, hashed like API keys) are read-only
or operator. A read-only token reads status, events, tuning status, live figures and the repository index, and gets
403 on every action; an operator's actions are in the audit log under its id. Rotating and revoking a token in
the file takes effect without a restart."""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import grpc
import httpx
import pytest
from app_clients import Clients, both_protocols
from scripted_backend import ScriptedBackend
from tritonclient.grpc import service_pb2

from services.gateway.settings import Settings
from services.keyfile.format import AdminEntry, KeyEntry, hash_secret, presented_admin_token
from services.keyfile.writing import write_entries

VIEWER = presented_admin_token("viewer", "secret-of-viewer")
OPERATOR = presented_admin_token("oncall", "secret-of-oncall")
SETTING = "s3cret-admin-token"
KEYS = {"mlps": KeyEntry("mlps", (hash_secret("secret-of-mlps"),), ("mlp",), None, "mlps")}


def write_admins(path: Path, **secrets: tuple[str, ...]) -> None:
    roles = {"viewer": "read-only", "oncall": "operator"}
    admins = {name: AdminEntry(name, tuple(map(hash_secret, given)), roles[name]) for name, given in secrets.items()}
    write_entries(path, KEYS, admins)


def gateway(backend: ScriptedBackend, settings: Settings, path: Path) -> AbstractAsyncContextManager[Clients]:
    return both_protocols(backend, settings, api_keys_file=path)


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


READS = [
    ("GET", "/admin/models"),
    ("GET", "/admin/models/double"),
    ("GET", "/admin/models/double/events"),
    ("GET", "/admin/models/double/live"),
    ("GET", "/admin/console/models"),
    ("GET", "/admin/events"),
    ("GET", "/admin/whoami"),
]
ACTIONS = [
    ("POST", "/admin/models/double/versions/2/activate"),
    ("POST", "/admin/models/double/rollback"),
    ("POST", "/admin/models/double/versions/2/load"),
    ("POST", "/admin/models/double/versions/2/unload"),
    ("PUT", "/admin/models/double/traffic"),
    ("PUT", "/admin/models/double/shadow"),
    ("PUT", "/admin/models/double/inference-log"),
    ("POST", "/admin/models/double/tune"),
    ("DELETE", "/admin/models/double/tune"),
    ("POST", "/admin/models/double/versions/2/compare"),
    ("POST", "/admin/repository/scan"),
    ("POST", "/v2/repository/models/double/load"),
    ("POST", "/v2/repository/models/double/unload"),
]


async def test_read_only_token_reads_everything_and_is_refused_every_action(
    backend: ScriptedBackend, settings: Settings, tmp_path: Path
) -> None:
    path = tmp_path / "keys.toml"
    write_admins(path, viewer=("secret-of-viewer",), oncall=("secret-of-oncall",))
    async with gateway(backend, settings.model_copy(update={"admin_token": None}), path) as (http, stub):
        reads = {path_: (await http.request(method, path_, headers=bearer(VIEWER))).status_code
                 for method, path_ in READS}
        index = await http.post("/v2/repository/index", json={}, headers=bearer(VIEWER))
        refused = {path_: await http.request(method, path_, json={}, headers=bearer(VIEWER))
                   for method, path_ in ACTIONS}
        with pytest.raises(grpc.aio.AioRpcError) as grpc_load:
            await stub.RepositoryModelLoad(service_pb2.RepositoryModelLoadRequest(model_name="double"),
                                           metadata=(("authorization", f"Bearer {VIEWER}"),))
        grpc_index = await stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(),
                                                metadata=(("authorization", f"Bearer {VIEWER}"),))
        whoami = (await http.get("/admin/whoami", headers=bearer(VIEWER))).json()
        events = (await http.get("/admin/models/double/events", headers=bearer(OPERATOR))).json()["events"]

    assert reads == dict.fromkeys((p for _, p in READS), 200)
    assert index.status_code == 200
    assert {entry["name"] for entry in index.json()} == {"double"}
    assert {entry.name for entry in grpc_index.models} == {"double"}
    for path_, response in refused.items():
        assert response.status_code == 403, (path_, response.text)
        assert "is read-only: this call needs an operator token" in response.json()["error"], path_
    assert grpc_load.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert whoami == {"actor": "admin:viewer", "role": "read-only"}
    assert not [event for event in events if event["action"] in ("activate", "rollback", "load", "unload")]
    assert backend.loads == []


async def test_operator_token_acts_and_the_audit_log_names_its_id(
    backend: ScriptedBackend, settings: Settings, tmp_path: Path
) -> None:
    path = tmp_path / "keys.toml"
    write_admins(path, viewer=("secret-of-viewer",), oncall=("secret-of-oncall",))
    async with gateway(backend, settings, path) as (http, _):
        activated = await http.post("/admin/models/double/versions/2/activate", headers=bearer(OPERATOR))
        by_setting = await http.post("/admin/models/double/rollback", headers=bearer(SETTING))
        events = (await http.get("/admin/models/double/events", headers=bearer(VIEWER))).json()["events"]
        whoami = (await http.get("/admin/whoami", headers=bearer(SETTING))).json()

    assert activated.status_code == 200, activated.text
    assert by_setting.status_code == 200, by_setting.text
    actors = {event["action"]: event["actor"] for event in events}
    assert actors["activate"] == "admin:oncall"
    assert actors["rollback"].startswith("token:")
    assert SETTING not in str(events)
    assert whoami == {"actor": actors["rollback"], "role": "operator"}


async def test_rotated_and_revoked_admin_tokens_take_effect_without_a_restart(
    backend: ScriptedBackend, settings: Settings, tmp_path: Path
) -> None:
    path = tmp_path / "keys.toml"
    write_admins(path, oncall=("secret-of-oncall",))
    rotated = presented_admin_token("oncall", "new-secret-of-oncall")
    async with gateway(backend, settings, path) as (http, _):
        before = await http.get("/admin/models", headers=bearer(rotated))
        write_admins(path, oncall=("secret-of-oncall", "new-secret-of-oncall"))
        both = await _eventually(http, rotated, 200)
        old_still = await http.get("/admin/models", headers=bearer(OPERATOR))
        write_admins(path, oncall=("new-secret-of-oncall",))
        old_gone = await _eventually(http, OPERATOR, 403)
        new_kept = await http.get("/admin/models", headers=bearer(rotated))
        path.write_text("[admins.oncall]\nrole = 'root'\n")  # malformed: the tokens loaded before stay in force
        await asyncio.sleep(1.2)
        after_bad_file = await http.get("/admin/models", headers=bearer(rotated))

    assert before.status_code == 403
    assert (both, old_still.status_code, old_gone, new_kept.status_code) == (200, 200, 403, 200)
    assert after_bad_file.status_code == 200


async def test_a_token_of_another_kind_is_no_admin_token(
    backend: ScriptedBackend, settings: Settings, tmp_path: Path
) -> None:
    """An API key is not an admin token, whatever it is sent as; a token is refused with the same words whether
    its id exists or not."""
    path = tmp_path / "keys.toml"
    write_admins(path, oncall=("secret-of-oncall",))
    api_key = "sy_mlps_secret-of-mlps"
    async with gateway(backend, settings.model_copy(update={"admin_token": None}), path) as (http, _):
        answers = [await http.get("/admin/models", headers=bearer(token)) for token in
                   (api_key, "sya_mlps_secret-of-mlps", "sya_oncall_wrong", "sya_nobody_x", "oncall")]
        as_api_key = await http.post("/v2/models/double/infer", headers={"x-api-key": OPERATOR},
                                     json={"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                                       "data": [1, 2, 3, 4]}]})

    assert [(a.status_code, a.json()) for a in answers] == [(403, {"error": "the admin token is not valid"})] * 5
    assert as_api_key.status_code == 401


async def _eventually(http: httpx.AsyncClient, token: str, status: int) -> int:
    """The status the gateway answers ``token`` with once the file change is seen (re-read once a second)."""
    answered = 0
    for _ in range(30):
        answered = (await http.get("/admin/models", headers=bearer(token))).status_code
        if answered == status:
            break
        await asyncio.sleep(0.1)
    return answered
