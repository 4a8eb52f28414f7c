"""Declares once the options that many ``switchyard models`` commands share. typer reads a command's options from
its signature, so ``admin_command`` gives the command the signature typer should see:

- the command's own options, then the ones every command takes (``--url``, ``--token``, ``--timeout``, ``--json``),
  which reach the command as one ``AdminCall``;
- in place of a parameter annotated with an option group (a dataclass whose fields are annotated as typer options),
  the group's options, which reach the command as one instance of the group.

Only typer, rich, httpx and the standard library: the root command imports this at startup."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass

from rich.console import RenderableType

from services.ops.calls import DEFAULT_URL, AsJson, Target, Timeout, Token, Url, act, reporting, show
from services.ops.client import AdminClient, JSONObject

__all__ = ["AdminCall", "admin_command"]

Command = Callable[..., None]
KEYWORD = inspect.Parameter.KEYWORD_ONLY


@dataclass(frozen=True)
class AdminCall:
    """What the options every command takes say: where the gateway is, and whether to print its JSON as it came."""

    target: Target
    as_json: bool

    def show(self, fetch: Callable[[AdminClient], JSONObject], view: Callable[[JSONObject], RenderableType]) -> None:
        """Prints what ``fetch`` gets through ``view`` (with ``--json``: the JSON as it came)."""
        with reporting(self.target), self.target.client() as client:
            show(fetch(client), self.as_json, view)

    def act(self, model: str, action: Callable[[AdminClient], JSONObject]) -> None:
        """Runs a version action on ``model``, showing its steps while it runs."""
        act(self.target, model, self.as_json, action)


def admin_command(timeout_s: float) -> Callable[[Command], Command]:
    """``command(call: AdminCall, *own)`` as a typer command with the options ``*own, --url, --token, --timeout,
    --json``; ``timeout_s`` is the ``--timeout`` default (an action may take minutes where a read takes seconds)."""
    shared = [
        inspect.Parameter("url", KEYWORD, default=DEFAULT_URL, annotation=Url),
        inspect.Parameter("token", KEYWORD, default=None, annotation=Token),
        inspect.Parameter("timeout", KEYWORD, default=timeout_s, annotation=Timeout),
        inspect.Parameter("as_json", KEYWORD, default=False, annotation=AsJson),
    ]

    def declare(command: Command) -> Command:
        own = list(inspect.signature(command, eval_str=True).parameters.values())[1:]
        groups = {param.name: param.annotation for param in own if _is_group(param.annotation)}
        # Keyword-only, all of them: typer passes every option by name, and a group may stand before a plain one.
        options = [
            option
            for param in own
            for option in (_options(param.annotation) if param.name in groups else [param.replace(kind=KEYWORD)])
        ]

        @functools.wraps(command)
        def run(*, url: str, token: str | None, timeout: float, as_json: bool, **given: object) -> None:
            for name, group in groups.items():
                given[name] = group(**{field.name: given.pop(field.name) for field in dataclasses.fields(group)})
            command(AdminCall(Target(url, token, timeout), as_json), **given)

        signature = inspect.Signature([*options, *shared], return_annotation=None)
        run.__signature__ = signature  # type: ignore[attr-defined]  # what typer (through inspect) reads
        run.__annotations__ = {param.name: param.annotation for param in signature.parameters.values()}
        return run

    return declare


def _is_group(annotation: object) -> bool:
    return isinstance(annotation, type) and dataclasses.is_dataclass(annotation)


def _options(group: type) -> list[inspect.Parameter]:
    hints = typing.get_type_hints(group, include_extras=True)  # the Annotated[...] that carry the typer options
    return [
        inspect.Parameter(field.name, KEYWORD, default=_default(field), annotation=hints[field.name])
        for field in dataclasses.fields(group)
    ]


def _default(field: dataclasses.Field[object]) -> object:
    """A field without a default is a required option."""
    return inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default
