"""Every ``switchyard`` command's ``--help`` reads whole at 80 columns: option names, environment variables and the
command summaries of a group are never cut, and no line runs past the edge. The commands come from the app's own
command tree, so a command added later is held to the same."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from services.cli import app

WIDTH = 80


def commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from commands(sub, (*path, name))


COMMANDS = dict(commands(typer.main.get_command(app)))


def help_at_80_columns(path: tuple[str, ...]) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(WIDTH)}, terminal_width=WIDTH)
    assert result.exit_code == 0, result.output
    return result.output


def whole(word: str, text: str) -> bool:
    """``word`` stands in ``text`` with nothing of an identifier (letters, digits, ``-``, ``_``) glued to it."""
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


@pytest.mark.parametrize("path", list(COMMANDS), ids=lambda path: " ".join(path) or "switchyard")
def test_help_shows_every_option_and_variable_whole_when_80_columns_wide(path: tuple[str, ...]) -> None:
    output = help_at_80_columns(path)
    command = COMMANDS[path]
    for param in (param for param in command.params if not getattr(param, "hidden", False)):
        for name in (*param.opts, *param.secondary_opts):
            if name.startswith("-"):
                assert whole(name, output), f"{name} is not whole in:\n{output}"
        if getattr(param, "show_envvar", False) and param.envvar:
            assert whole(param.envvar, output), f"{param.envvar} is not whole in:\n{output}"
    for name, sub in getattr(command, "commands", {}).items():
        summary = sub.get_short_help_str(limit=10**6)
        assert summary in " ".join(output.split()), f"the summary of {name} is cut in:\n{output}"
    assert "…" not in output
    assert [line for line in output.splitlines() if len(line) > WIDTH] == []


def test_unload_help_says_its_drain_timeout_waits_for_the_version_it_unloads() -> None:
    """unload replaces nothing: its --drain-timeout is not activate's and rollback's wait for the replaced version."""
    help_text = " ".join(help_at_80_columns(("models", "unload")).split())
    assert "replaced version" not in help_text
    assert ("--drain-timeout <float range> Seconds to wait for VERSION's requests in flight to finish before it is "
            "unloaded") in help_text
