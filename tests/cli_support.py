"""Helpers for the ``switchyard models`` tests: run the command against a gateway, and read its tables."""

from __future__ import annotations

from collections.abc import Mapping

from typer.testing import CliRunner, Result

from services.cli import app
from tests.gateway_harness import RunningGateway

TOKEN = "cli-test-admin-token-5f3a"
NO_ENVIRONMENT: dict[str, str | None] = {"SWITCHYARD_ADMIN_URL": None, "SWITCHYARD_ADMIN_TOKEN": None}
FEATURES = {"name": "features", "shape": [1, 32], "datatype": "FP32", "data": [0.25] * 32}


def models(gateway: RunningGateway | None, *args: str, token: str | None = TOKEN, **env: str) -> Result:
    """``switchyard models ARGS --url ... --token ...`` (neither when ``gateway`` is None: from ``env`` then); checks
    what every invocation must hold: no traceback, the token nowhere in the output."""
    options = [] if gateway is None else ["--url", f"http://{gateway.http_url}"]
    if gateway is not None and token is not None:
        options += ["--token", token]
    environment: Mapping[str, str | None] = {**NO_ENVIRONMENT, **env}
    result = CliRunner().invoke(app, ["models", *args, *options], env=environment)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    assert TOKEN not in result.output
    return result


def one_error_line(result: Result) -> str:
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert result.stdout == ""
    return lines[0]


def squeezed(output: str) -> str:
    """The output with each run of spaces made one: assertions that do not depend on column widths."""
    return "\n".join(" ".join(line.split()) for line in output.splitlines())


def cells(output: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is ``first``."""
    for line in output.splitlines():
        row = [cell.strip() for cell in line.split("│")[1:-1]]
        if row and row[0] == first:
            return row
    raise AssertionError(f"no row {first!r} in:\n{output}")
