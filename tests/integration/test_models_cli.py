"""``switchyard models`` against a real gateway on a real port: tables that name the right versions, activate and
rollback that flip what unversioned requests get, one ``error:`` line and the right exit code for every failure,
``--json`` for scripts, and the admin token never printed."""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from services.gateway.settings import Settings
from tests.cli_support import FEATURES, TOKEN, models, one_error_line, squeezed
from tests.gateway_harness import RunningGateway, running_gateway


@contextmanager
def serving_mlp(repository: Path, folder: Path) -> Iterator[RunningGateway]:
    """A gateway serving a private copy of ``mlp`` (versions 1 and 2, policy ``all``: 2 is stable), no polling."""
    shutil.copytree(repository / "mlp", folder / "mlp")
    settings = Settings(repository=folder, port=0, grpc_port=0, admin_token=TOKEN, repository_poll_s=0)  # type: ignore[arg-type]
    with running_gateway(settings) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def shared(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    """For tests that change nothing (reads, and actions the gateway refuses)."""
    with serving_mlp(repository, tmp_path_factory.mktemp("cli_shared")) as gateway:
        yield gateway


@pytest.fixture
def own(repository: Path, tmp_path: Path) -> Iterator[RunningGateway]:
    """For tests that switch, load, unload or add versions."""
    with serving_mlp(repository, tmp_path) as gateway:
        yield gateway








def served_version(gateway: RunningGateway, version: int | None = None) -> int:
    path = "/v2/models/mlp/infer" if version is None else f"/v2/models/mlp/versions/{version}/infer"
    response = httpx.post(f"http://{gateway.http_url}{path}", json={"inputs": [FEATURES]})
    assert response.status_code == 200, response.text
    return int(response.headers["X-Model-Version"])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# -- reading --------------------------------------------------------------------------------------------------
@pytest.mark.slow  # a gateway on real ports
def test_models_list_shows_routing_and_versions_when_the_gateway_serves_mlp(shared: RunningGateway) -> None:
    result = models(shared, "list")
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if " mlp " in line)
    cells = [cell.strip() for cell in row.split("│")[1:-1]]
    assert cells == ["mlp", "yes", "2", "none", "1", "1, 2", "1, 2", ""]


@pytest.mark.slow  # a gateway on real ports
def test_models_status_shows_routing_loaded_and_policy_versions_when_asked_for_mlp(shared: RunningGateway) -> None:
    result = models(shared, "status", "mlp")
    assert result.exit_code == 0, result.output
    assert "mlp (onnxruntime_onnx) ready" in squeezed(result.stdout)
    assert "routing stable 2, previous none, generation 1" in squeezed(result.stdout)
    assert "│ 2 (stable) │ READY │ 0      │ yes" in result.stdout
    assert "│ 1          │ READY │ 0      │ yes" in result.stdout
    assert "policy selects 1, 2" in squeezed(result.stdout)
    assert "action now none" in squeezed(result.stdout)


@pytest.mark.slow  # a gateway on real ports
def test_models_commands_answer_json_when_asked_with_json(shared: RunningGateway) -> None:
    listed = json.loads(models(shared, "list", "--json").stdout)
    assert [(m["name"], m["stable"], m["loaded"]) for m in listed["models"]] == [("mlp", 2, [1, 2])]
    status = json.loads(models(shared, "status", "mlp", "--json").stdout)
    assert [v["version"] for v in status["loaded"]] == [1, 2]
    events = json.loads(models(shared, "events", "mlp", "--limit", "1", "--json").stdout)
    assert [(e["action"], e["versions"]) for e in events["events"]] == [("startup", {"stable": 2})]
    report = json.loads(models(shared, "activate", "mlp", "2", "--json").stdout)
    assert (report["result"], report["versions"]) == ("unchanged", {"from": 2, "to": 2})


@pytest.mark.slow  # a gateway on real ports
def test_models_commands_use_the_environment_when_url_and_token_are_not_given(shared: RunningGateway) -> None:
    result = models(
        None, "status", "mlp", SWITCHYARD_ADMIN_URL=f"http://{shared.http_url}", SWITCHYARD_ADMIN_TOKEN=TOKEN
    )
    assert result.exit_code == 0, result.output
    assert "stable 2" in result.stdout


# -- switching ------------------------------------------------------------------------------------------------
@pytest.mark.slow  # a gateway on real ports
def test_models_activate_and_rollback_flip_unversioned_requests_when_both_versions_are_loaded(
    own: RunningGateway,
) -> None:
    assert served_version(own) == 2
    activated = models(own, "activate", "mlp", "1")
    assert activated.exit_code == 0, activated.output
    assert served_version(own) == 1
    out = activated.stdout
    assert "activate mlp: version 2 → 1: ok" in out
    for step in ("load", "compare", "flip", "drain"):
        assert any(line.split()[-3:-2] == [step] for line in out.splitlines()), (step, out)
    assert "routing stable 1, previous 2, generation 2" in squeezed(out)
    assert "max abs diff vs version 2: logits" in squeezed(out)
    assert "drained yes (in flight left: 0)" in squeezed(out)

    rolled_back = models(own, "rollback", "mlp", "--no-keep-previous", "--drain-timeout", "5")
    assert rolled_back.exit_code == 0, rolled_back.output
    assert served_version(own) == 2
    assert "rollback mlp: version 1 → 2: ok" in rolled_back.stdout
    assert "unloaded 1" in squeezed(rolled_back.stdout)

    audit = models(own, "events", "mlp")
    assert audit.exit_code == 0, audit.output
    rows = [[cell.strip() for cell in line.split("│")[2:5]] for line in audit.stdout.splitlines() if "token:" in line]
    assert rows == [["activate", "2 → 1", "ok"], ["rollback", "1 → 2", "ok"]]


@pytest.mark.slow  # a gateway on real ports
def test_models_unload_and_load_report_their_steps_when_the_version_is_not_stable(own: RunningGateway) -> None:
    unloaded = models(own, "unload", "mlp", "1")
    assert unloaded.exit_code == 0, unloaded.output
    assert "unload mlp: version 1: ok" in unloaded.stdout
    assert "drained yes (in flight left: 0)" in squeezed(unloaded.stdout)
    assert "on disk, not loaded 1" in squeezed(models(own, "status", "mlp").stdout)

    loaded = models(own, "load", "mlp", "1")
    assert loaded.exit_code == 0, loaded.output
    assert "load mlp: version 1: ok" in loaded.stdout
    assert "warmup" in loaded.stdout
    assert served_version(own, 1) == 1
    assert served_version(own) == 2  # loading is not routing
    assert "version 1 is already loaded: unchanged" in models(own, "load", "mlp", "1").stdout


@pytest.mark.slow  # a gateway on real ports
def test_models_scan_lists_a_new_version_without_serving_it_when_one_appears_on_disk(
    own: RunningGateway, tmp_path: Path
) -> None:
    shutil.copytree(tmp_path / "mlp" / "2", tmp_path / "mlp" / "3")
    scanned = models(own, "scan")
    assert scanned.exit_code == 0, scanned.output
    assert "new versions mlp 3 (served once activated)" in squeezed(scanned.stdout)
    assert "on disk, not loaded 3" in squeezed(models(own, "status", "mlp").stdout)
    assert served_version(own) == 2
    assert "has not changed" in models(own, "scan").stdout


# -- failing --------------------------------------------------------------------------------------------------
@pytest.mark.slow  # a gateway on real ports
def test_models_activate_exits_1_with_the_server_error_when_the_version_is_not_on_disk(
    shared: RunningGateway,
) -> None:
    result = models(shared, "activate", "mlp", "9")
    assert result.exit_code == 1
    line = one_error_line(result)
    assert "failed at step 'load'" in line
    assert "version 9 is not found; the repository has no version 9 of it; version 2 keeps serving" in line


@pytest.mark.slow  # a gateway on real ports
def test_models_unload_and_rollback_exit_1_with_the_conflict_when_the_state_forbids_them(
    shared: RunningGateway,
) -> None:
    unload = models(shared, "unload", "mlp", "2")
    assert unload.exit_code == 1
    assert one_error_line(unload) == (
        "error: version 2 is the stable version of model 'mlp'; activate another version first"
    )
    rollback = models(shared, "rollback", "mlp")
    assert rollback.exit_code == 1
    assert one_error_line(rollback) == "error: model 'mlp' has no previous version to roll back to"
    unknown = models(shared, "status", "nope")
    assert (unknown.exit_code, one_error_line(unknown)) == (1, "error: Request for unknown model: 'nope' is not found")


@pytest.mark.slow  # a gateway on real ports
def test_models_activate_sends_only_given_options_and_exits_1_when_the_gateway_rejects_one(
    shared: RunningGateway,
) -> None:
    result = models(shared, "activate", "mlp", "1", "--drain-timeout", "100000")
    assert result.exit_code == 1
    assert "option 'drain_timeout_s' must be a number of seconds from 0 to 600" in one_error_line(result)
    assert served_version(shared) == 2


@pytest.mark.slow  # a gateway on real ports
def test_models_commands_exit_2_with_the_server_message_when_the_token_is_wrong_or_missing(
    shared: RunningGateway,
) -> None:
    wrong_token = "not-" + TOKEN[4:]
    wrong = models(shared, "list", token=wrong_token)
    assert wrong.exit_code == 2
    assert one_error_line(wrong) == ("error: the admin token is not valid; --token or SWITCHYARD_ADMIN_TOKEN must "
                                     "hold the gateway's SWITCHYARD_ADMIN_TOKEN")
    assert wrong_token not in wrong.output
    for command in (["activate", "mlp", "1"], ["list"]):
        missing = models(shared, *command, token=None)
        assert missing.exit_code == 2
        assert one_error_line(missing).endswith(
            "needs 'Authorization: Bearer <token>' (the gateway's SWITCHYARD_ADMIN_TOKEN); give it with --token or "
            "the SWITCHYARD_ADMIN_TOKEN environment variable")


def test_models_commands_exit_2_saying_cannot_reach_when_nothing_listens_at_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    for args in (["list"], ["activate", "mlp", "1"]):
        result = models(None, *args, SWITCHYARD_ADMIN_URL=url, SWITCHYARD_ADMIN_TOKEN=TOKEN)
        assert result.exit_code == 2
        line = one_error_line(result)
        assert line.startswith(f"error: cannot reach the gateway at {url}: ")
        assert line.endswith("(is it running? set --url or SWITCHYARD_ADMIN_URL)")
