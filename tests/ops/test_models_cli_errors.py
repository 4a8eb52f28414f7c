"""``switchyard models`` set up wrong, against a real gateway: the one error line says what to fix. Refused for its
token, it names the admin tokens this gateway takes (asked of the gateway itself), so that a gateway whose admin
tokens live in its keys file does not send the user looking for a SWITCHYARD_ADMIN_TOKEN it never had; pointed at
the gateway's gRPC port, it says that --url takes the HTTP one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr
from typer.testing import CliRunner

from services.cli import app
from services.gateway.settings import Settings
from tests.cli_support import models, one_error_line
from tests.gateway_harness import RunningGateway, running_gateway

pytestmark = pytest.mark.slow  # a gateway on real ports

WRONG_TOKEN = "sya_oncall_not-the-secret-it-was-given"


def operator_token_file(folder: Path) -> Path:
    """A keys file holding one operator admin token, written by ``switchyard keys add`` as a user writes it."""
    path = folder / "keys.toml"
    added = CliRunner().invoke(app, ["keys", "add", "oncall", "--role", "operator", "--file", str(path)])
    assert added.exit_code == 0, added.output
    return path


def empty_repository(folder: Path) -> Path:
    """The admin API answers whatever the repository holds: none of these calls needs a model."""
    repository = folder / "model_repository"
    repository.mkdir()
    return repository


@pytest.fixture
def keys_file_gateway(tmp_path: Path) -> Iterator[RunningGateway]:
    """Admin tokens from the keys file only: no SWITCHYARD_ADMIN_TOKEN."""
    settings = Settings(repository=empty_repository(tmp_path), port=0, grpc_port=0, repository_poll_s=0,
                        api_keys_file=operator_token_file(tmp_path))
    with running_gateway(settings) as gateway:
        yield gateway


@pytest.fixture
def both_kinds_gateway(tmp_path: Path) -> Iterator[RunningGateway]:
    """Admin tokens from the keys file and from SWITCHYARD_ADMIN_TOKEN."""
    settings = Settings(repository=empty_repository(tmp_path), port=0, grpc_port=0, repository_poll_s=0,
                        api_keys_file=operator_token_file(tmp_path), admin_token=SecretStr("setting-token-7c1e"))
    with running_gateway(settings) as gateway:
        yield gateway


def test_a_wrong_token_points_at_the_keys_file_when_the_gateway_takes_admin_tokens_from_it_only(
    keys_file_gateway: RunningGateway,
) -> None:
    result = models(keys_file_gateway, "list", token=WRONG_TOKEN)

    assert result.exit_code == 2
    assert one_error_line(result) == ("error: the admin token is not valid; --token or SWITCHYARD_ADMIN_TOKEN must "
                                      "hold an admin token of the gateway's keys file")
    assert WRONG_TOKEN not in result.output


def test_a_wrong_token_names_both_kinds_when_the_gateway_takes_both(both_kinds_gateway: RunningGateway) -> None:
    result = models(both_kinds_gateway, "activate", "mlp", "1", token=WRONG_TOKEN)

    assert result.exit_code == 2
    assert one_error_line(result) == ("error: the admin token is not valid; --token or SWITCHYARD_ADMIN_TOKEN must "
                                      "hold an admin token of the gateway's keys file or the gateway's "
                                      "SWITCHYARD_ADMIN_TOKEN")


def test_a_url_at_the_grpc_port_is_named_as_such_not_as_a_gateway_that_is_not_running(
    keys_file_gateway: RunningGateway,
) -> None:
    url = f"http://{keys_file_gateway.grpc_url}"
    result = models(None, "list", SWITCHYARD_ADMIN_URL=url, SWITCHYARD_ADMIN_TOKEN=WRONG_TOKEN)

    assert result.exit_code == 2
    line = one_error_line(result)
    assert line.startswith(f"error: cannot reach the gateway at {url}: what answered speaks no HTTP/1.1 (")
    assert line.endswith("(--url takes the gateway's HTTP address: is this its gRPC port?)")
    assert "is it running?" not in line
