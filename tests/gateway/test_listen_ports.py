"""The listeners' ports: refused at startup, naming the variable and the option, when out of range, shared by HTTP
and gRPC, or held by another process (for one process and for a node of workers); and a repository without models
warned about at start."""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry
from pydantic import ValidationError
from scripted_backend import ScriptedBackend, double_repository
from typer.testing import CliRunner

from services.cli import app
from services.gateway.app import create_app
from services.gateway.grpc_api.server import GrpcListenError
from services.gateway.server import PortUnavailable, check_ports, check_startup
from services.gateway.settings import Settings
from services.gateway.workers.sockets import reuseport_socket
from services.gateway.workers.supervisor import Supervisor


@pytest.fixture
def held() -> Iterator[int]:
    """A port another process listens on."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        yield other.getsockname()[1]


def serve(tmp_path: Path, *arguments: str) -> tuple[int, str]:
    (tmp_path / "repository").mkdir(exist_ok=True)
    result = CliRunner().invoke(
        app, ["serve", "--repository", str(tmp_path / "repository"), *arguments],
        env={"SWITCHYARD_STATE_PATH": str(tmp_path / "state" / "routing.json")},
    )
    assert "Traceback" not in result.output
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.parametrize("name", ["port", "grpc_port"])
@pytest.mark.parametrize("value", [-1, 65536, 70000])
def test_settings_refuse_a_port_when_out_of_range(name: str, value: int) -> None:
    with pytest.raises(ValidationError, match=f"SWITCHYARD_{name.upper()} must lie between 0 and 65535"):
        Settings(**{name: value})  # type: ignore[arg-type]


def test_settings_take_a_free_port_or_the_last_when_zero_or_65535() -> None:
    assert Settings(port=0, grpc_port=0).grpc_port == 0  # both picked by the kernel: never the same
    assert Settings(port=65535, grpc_port=None).port == 65535


def test_serve_refuses_with_one_line_naming_variable_and_option_when_port_out_of_range(tmp_path: Path) -> None:
    code, output = serve(tmp_path, "--port", "70000", "--grpc-port", "19191")
    assert code == 2
    assert output == "error: SWITCHYARD_PORT / --port must lie between 0 and 65535 (0: a free port), got 70000"


def test_serve_refuses_naming_both_settings_when_http_and_grpc_share_a_port(tmp_path: Path) -> None:
    code, output = serve(tmp_path, "--port", "9100", "--grpc-port", "9100")
    assert code == 2
    assert "SWITCHYARD_PORT / --port and SWITCHYARD_GRPC_PORT / --grpc-port are both 9100" in output


def test_serve_refuses_with_one_line_naming_the_setting_when_grpc_port_is_held(tmp_path: Path, held: int) -> None:
    code, output = serve(tmp_path, "--port", "0", "--grpc-port", str(held))
    assert code == 2
    assert output.endswith(
        f"error: gRPC cannot listen on 127.0.0.1:{held}: address already in use (SWITCHYARD_GRPC_PORT / --grpc-port); "
        "choose a free port, or stop what holds this one"
    )


def test_check_ports_names_http_setting_when_http_port_is_held(held: int) -> None:
    with pytest.raises(PortUnavailable, match=rf"^HTTP cannot listen on 127.0.0.1:{held}: .* \(SWITCHYARD_PORT\)"):
        check_ports(Settings(port=held, grpc_port=0))
    check_ports(Settings(port=0, grpc_port=None))  # 0: a free port, never held


def test_supervisor_refuses_when_another_nodes_workers_share_the_port(tmp_path: Path) -> None:
    # Another node's listening SO_REUSEPORT socket of this user: the node's own reservation would bind beside it.
    with reuseport_socket("127.0.0.1", 0) as other:
        other.listen()
        port = other.getsockname()[1]
        settings = Settings(repository=tmp_path, port=0, grpc_port=port, workers=2)
        with pytest.raises(PortUnavailable, match=rf"gRPC cannot listen on 127.0.0.1:{port}: .*SWITCHYARD_GRPC_PORT"):
            Supervisor(settings)


async def test_lifespan_fails_naming_the_grpc_port_when_it_cannot_be_bound(tmp_path: Path, held: int) -> None:
    # The port taken after the check at startup: gRPC's own error says only "Failed to bind".
    settings = Settings(repository=double_repository(tmp_path / "repository"), grpc_port=held, repository_poll_s=0,
                        state_path=tmp_path / "state" / "routing.json")
    gateway = create_app(settings, backend=ScriptedBackend(), registry=CollectorRegistry())
    with pytest.raises(GrpcListenError, match=rf"gRPC cannot listen on 127.0.0.1:{held}: the port is in use"):
        async with LifespanManager(gateway):
            pass


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        ("empty", r"holds no model: expected a folder per model, each with a config.pbtxt"),
        ("model folder", r"holds a config.pbtxt itself: it is a model folder.*point .* at its parent, .*/repository$"),
    ],
)
def test_startup_warns_naming_the_path_when_repository_has_no_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, layout: str, expected: str
) -> None:
    root = tmp_path / "repository"
    path = double_repository(root) / "double" if layout == "model folder" else root
    path.mkdir(parents=True, exist_ok=True)
    with caplog.at_level(logging.WARNING, logger="services.gateway.server"):
        check_startup(Settings(repository=path, state_path=tmp_path / "state" / "routing.json"))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and str(path) in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"model repository {path} ")
    assert re.search(expected, warnings[0])
    caplog.clear()
    double_repository(root)
    check_startup(Settings(repository=root, state_path=tmp_path / "state" / "routing.json"))
    assert not [r for r in caplog.records if "model repository" in r.getMessage()]  # a repository with a model


@pytest.mark.parametrize("spelled", ["off", "OFF", "none"])
def test_grpc_port_off_serves_no_grpc(tmp_path: Path, spelled: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings(repository=tmp_path, grpc_port=spelled).grpc_port is None  # type: ignore[arg-type]
    monkeypatch.setenv("SWITCHYARD_GRPC_PORT", spelled)
    assert Settings(repository=tmp_path).grpc_port is None


@pytest.mark.parametrize("kind", ["missing", "a file"])
def test_serve_names_the_repository_it_cannot_find_and_how_to_give_one(tmp_path: Path, kind: str) -> None:
    """Started outside the checkout, ``switchyard serve`` finds no ``model_repository`` there: the line says where it
    looked and which option or variable names another folder, not only the checkout's make target."""
    repository = tmp_path / "elsewhere"
    if kind == "a file":
        repository.write_text("")
    result = CliRunner().invoke(app, ["serve", "--repository", str(repository)])
    output = " ".join(result.output.split())
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    found = "does not exist" if kind == "missing" else "is not a folder"
    assert output.startswith(f"error: the model repository {repository} ({repository.resolve()}) {found}")
    assert "give SWITCHYARD_REPOSITORY / --repository your repository's folder" in output
