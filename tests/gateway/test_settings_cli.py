"""``switchyard settings``: every gateway setting and every variable a command's option reads, with its default,
readable at 80 columns; a setting without a description is refused, not listed blank."""

from __future__ import annotations

import pytest
import typer
from pydantic_settings import BaseSettings
from typer.testing import CliRunner

from services.cli import app
from services.gateway.settings import Settings
from services.gateway.settings_cli import gateway_variables


def test_settings_lists_every_variable_with_its_default_when_run_at_80_columns() -> None:
    result = CliRunner().invoke(app, ["settings"], env={"COLUMNS": "80"})

    assert result.exit_code == 0, result.output
    heads = [line for line in result.output.splitlines() if line.startswith("SWITCHYARD_")]
    listed = [head.split("=")[0].split(" ")[0] for head in heads]
    assert listed[: len(Settings.model_fields)] == [f"SWITCHYARD_{name.upper()}" for name in Settings.model_fields]
    assert {"SWITCHYARD_MAX_BODY_BYTES=67108864", "SWITCHYARD_ADMIN_TOKEN (unset)", "SWITCHYARD_GC_FREEZE=true",
            "SWITCHYARD_TRITON_HTTP_URL= (empty)", "SWITCHYARD_ADMIN_URL=http://127.0.0.1:8000"} <= set(heads)
    assert "Option: --url (console, models, tune)." in result.output
    assert [line for line in result.output.splitlines() if len(line) > 80] == []


def test_settings_refuses_a_setting_without_a_description_naming_it() -> None:
    class Undocumented(BaseSettings):
        quiet: int = 1

    with pytest.raises(ValueError, match=r"Undocumented\.quiet has no docstring"):
        gateway_variables(Undocumented, typer.main.get_command(app))


def test_settings_show_what_this_environment_sets_beside_the_defaults_and_hide_secrets() -> None:
    env = {"COLUMNS": "80", "SWITCHYARD_PORT": "9000", "SWITCHYARD_ADMIN_TOKEN": "s3cret-admin-token"}

    result = CliRunner().invoke(app, ["settings"], env=env)

    assert result.exit_code == 0, result.output
    heads = [line for line in result.output.splitlines() if line.startswith("SWITCHYARD_")]
    assert "SWITCHYARD_PORT=8000    set here: '9000'" in heads
    assert "SWITCHYARD_ADMIN_TOKEN (unset)    set here: (hidden)" in heads
    assert "s3cret" not in result.output
