"""``switchyard settings``: every ``SWITCHYARD_*`` variable with its default and what it sets, generated from the
gateway's ``Settings`` and from the commands' options; ``--markdown`` writes docs/settings.md."""

from __future__ import annotations

import os
import re
import shutil
import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from pydantic_settings import BaseSettings

__all__ = ["Variable", "command_variables", "gateway_variables", "markdown", "register", "text"]

PREFIX = "SWITCHYARD_"
SERVE = "serve"
"""The command whose options override the gateway's settings."""
WIDEST_TEXT = 100
"""Descriptions wrap at the terminal's width, but no wider: longer lines are hard to read."""
RST_CODE = re.compile(r"``(.+?)``")
SECRET = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|REDIS_URL")
"""Variables whose value ``switchyard settings`` never prints (a Redis URL may hold a password)."""


@dataclass(frozen=True)
class Variable:
    name: str
    default: str | None
    """As one writes it in the environment; None: unset."""
    description: str
    options: tuple[str, ...] = ()
    """The options that set the same value (``--port``)."""
    commands: tuple[str, ...] = ()
    """The commands whose ``options`` read the variable, when they are not ``serve``."""


def register(app: typer.Typer) -> None:
    app.command("settings")(settings_command)


def settings_command(
    ctx: typer.Context,
    as_markdown: Annotated[bool, typer.Option(
        "--markdown", help="Print the page docs/settings.md holds (Markdown tables) instead of the list."
    )] = False,
) -> None:
    """List every SWITCHYARD_* environment variable with its default and what it sets."""
    # Imported only now: pydantic-settings would add a sixth of a second to the start of every `switchyard` command.
    from services.gateway.settings import Settings

    root = ctx.find_root().command
    gateway = gateway_variables(Settings, root)
    commands = command_variables(root, {variable.name for variable in gateway})
    typer.echo(markdown(gateway, commands) if as_markdown else text(gateway, commands), nl=False)


def gateway_variables(settings: type[BaseSettings], root: Any) -> list[Variable]:
    """One variable per field of ``settings``, in the class's order, with the ``serve`` option that overrides it."""
    flags = {envvar: param.opts[0] for path, param, envvar in _options(root) if path == [SERVE]}
    variables = []
    for field_name, field in settings.model_fields.items():
        name = PREFIX + field_name.upper()
        if not field.description:
            raise ValueError(f"{settings.__name__}.{field_name} has no docstring: every setting needs a description")
        flag = (flags[name],) if name in flags else ()
        variables.append(Variable(name, _shown(field.default), _one_line(field.description), flag))
    return variables


def command_variables(root: Any, settings: set[str]) -> list[Variable]:
    """The variables the commands' options read, each once with every option that reads it; ``serve``'s options
    of the gateway ``settings`` are left out (the gateway's list names them)."""
    found: dict[str, tuple[Any, dict[str, None], dict[str, None]]] = {}  # dicts: ordered sets
    for path, param, envvar in _options(root):
        if path == [SERVE] and envvar in settings:
            continue
        _, options, commands = found.setdefault(envvar, (param, {}, {}))
        options[param.opts[0]] = None
        commands[path[0]] = None
    return [
        Variable(envvar, _shown(param.default), _one_line(param.help or ""), tuple(options), tuple(commands))
        for envvar, (param, options, commands) in found.items()
    ]


def text(gateway: list[Variable], commands: list[Variable], environ: Mapping[str, str] | None = None) -> str:
    """``NAME=default``, then the description indented under it, wrapped to the terminal: whole at 80 columns. A
    variable set in ``environ`` (this shell's environment) also shows what it is set to, secrets hidden: the
    defaults alone would read as the values in force."""
    environ = os.environ if environ is None else environ
    width = min(shutil.get_terminal_size().columns, WIDEST_TEXT)
    lines = [*_wrap("The gateway (switchyard serve) reads these when it starts; the serve option named under a "
                    "variable overrides it. Each is shown with its default; one set in this shell's environment "
                    "also with its value. Details: docs/settings.md.", width, indent=""), ""]
    lines += [line for variable in gateway for line in _entry(variable, width, environ)]
    lines += ["", *_wrap("These commands' options read a variable when they are not given.", width, indent=""), ""]
    lines += [line for variable in commands for line in _entry(variable, width, environ)]
    return "\n".join(lines) + "\n"


def markdown(gateway: list[Variable], commands: list[Variable]) -> str:
    lines = [
        "# Settings",
        "",
        "<!-- Generated: `switchyard settings --markdown > docs/settings.md`; tests/test_docs.py fails when this page",
        "     is not what the command prints. Edit the docstrings in services/gateway/settings.py instead. -->",
        "",
        "Every `SWITCHYARD_*` environment variable, its default and what it sets. `switchyard settings` prints the",
        "same list in a terminal. Booleans are `true` or `false`; names ending in `_s`, `_ms` and `_us` hold",
        "seconds, milliseconds and microseconds.",
        "",
        "## The gateway",
        "",
        "`switchyard serve` reads these when it starts; the option named beside a variable overrides it. A value",
        "it cannot use stops the start with a line naming the variable.",
        "",
        "| variable | default | what it sets |",
        "| --- | --- | --- |",
    ]
    for variable in gateway:
        option = "".join(f" (`{flag}`)" for flag in variable.options)
        default = _default_cell(variable.default)
        lines.append(f"| `{variable.name}`{option} | {default} | {_cell(variable.description)} |")
    lines += [
        "",
        "## The commands",
        "",
        "Options of these commands that read a variable when they are not given.",
        "",
        "| variable | read by | default | what it sets |",
        "| --- | --- | --- | --- |",
    ]
    for variable in commands:
        options = ", ".join(f"`{option}`" for option in variable.options)
        read_by = f"{options} of {', '.join(f'`switchyard {command}`' for command in variable.commands)}"
        default = _default_cell(variable.default)
        lines.append(f"| `{variable.name}` | {read_by} | {default} | {_cell(variable.description)} |")
    return "\n".join(lines) + "\n"


def _options(command: Any, path: list[str] | None = None) -> Iterator[tuple[list[str], Any, str]]:
    """``(command path, option, variable)`` for every option of the command tree that reads a SWITCHYARD_ variable."""
    path = path or []
    for param in command.params:
        envvars = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or ())
        for envvar in envvars:
            if envvar.startswith(PREFIX):
                yield path, param, envvar
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from _options(sub, [*path, name])


def _entry(variable: Variable, width: int, environ: Mapping[str, str]) -> list[str]:
    body = variable.description
    if variable.options:
        commands = f" ({', '.join(variable.commands)})" if variable.commands else ""
        body += f" Option: {', '.join(variable.options)}{commands}."
    head = _assignment(variable)
    if variable.name in environ:
        value = environ[variable.name]
        head += "    set here: " + ("(hidden)" if SECRET.search(variable.name) else f"{value!r}")
    return [head, *_wrap(body, width)]


def _wrap(paragraph: str, width: int, indent: str = "    ") -> list[str]:
    # Neither a long word (a variable, an address) nor an option name at its hyphens is ever split.
    return textwrap.wrap(paragraph, width=width, initial_indent=indent, subsequent_indent=indent,
                         break_long_words=False, break_on_hyphens=False)


def _shown(default: Any) -> str | None:
    """A default as one would write it in the environment; None for none."""
    if default is None:
        return None
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, float) and default.is_integer():
        return str(int(default))
    return str(default)


def _assignment(variable: Variable) -> str:
    if variable.default is None:
        return f"{variable.name} (unset)"
    return f"{variable.name}={variable.default}" + ("" if variable.default else " (empty)")


def _default_cell(default: str | None) -> str:
    if default is None:
        return "unset"
    return f"`{default}`" if default else "empty"


def _one_line(description: str) -> str:
    return RST_CODE.sub(r"`\1`", " ".join(description.split()))


def _cell(description: str) -> str:
    return description.replace("|", "\\|")
