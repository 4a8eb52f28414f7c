"""``switchyard console``: the sign-in link it prints, and the error when it has no token (no gateway needed)."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from typer.testing import CliRunner

from services.cli import app
from tests.cli_support import NO_ENVIRONMENT


def test_console_prints_the_sign_in_link_when_the_token_comes_from_the_environment() -> None:
    env = {**NO_ENVIRONMENT, "SWITCHYARD_ADMIN_TOKEN": "s3cret+/&="}
    result = CliRunner().invoke(app, ["console", "--url", "gateway.example:8080/"], env=env)
    assert result.exit_code == 0, result.output
    link = result.stdout.strip()
    assert link == "http://gateway.example:8080/admin/ui#token=s3cret%2B%2F%26%3D"
    assert unquote(urlsplit(link).fragment.removeprefix("token=")) == "s3cret+/&="
    assert "do not share it" in result.stderr


def test_console_prefers_the_token_option_when_both_are_given() -> None:
    env = {**NO_ENVIRONMENT, "SWITCHYARD_ADMIN_TOKEN": "from-env", "SWITCHYARD_ADMIN_URL": "https://ops.example"}
    result = CliRunner().invoke(app, ["console", "--token", "from-option"], env=env)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "https://ops.example/admin/ui#token=from-option"


def test_console_exits_2_naming_both_sources_when_no_token_is_given() -> None:
    result = CliRunner().invoke(app, ["console"], env=NO_ENVIRONMENT)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith("error: no admin token: give --token or set SWITCHYARD_ADMIN_TOKEN")


def test_console_exits_2_naming_the_url_when_it_is_no_http_address() -> None:
    result = CliRunner().invoke(app, ["console", "--token", "t", "--url", "ftp://gateway"], env=NO_ENVIRONMENT)
    assert result.exit_code == 2
    assert "--url must be the gateway's HTTP address" in result.stderr
    assert "'ftp://gateway'" in result.stderr
