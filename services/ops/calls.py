"""What every ``switchyard models`` command shares: the common options, the call to the admin API, the live view of
a running action, and how a failure becomes one ``error:`` line on stderr and an exit code (never a traceback).
Only typer, rich, httpx and the standard library: the root command imports this at startup."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, NoReturn

import typer
from rich.console import Console, RenderableType
from rich.live import Live

from services.ops.client import DEFAULT_URL, AdminClient, AdminError, GatewayUnreachable, JSONObject
from services.ops.format import stdout
from services.ops.models_views import LiveSteps, report_view

__all__ = [
    "ACTION_TIMEOUT_S",
    "DEFAULT_URL",
    "EXIT_ACCESS",
    "EXIT_API",
    "READ_TIMEOUT_S",
    "AsJson",
    "Model",
    "Target",
    "Timeout",
    "Token",
    "Url",
    "Version",
    "act",
    "reporting",
    "show",
]

READ_TIMEOUT_S = 30.0
ACTION_TIMEOUT_S = 300.0
"""An activate loads, warms up, compares and drains (up to the drain timeout): minutes, not seconds."""
POLL_INTERVAL_S = 0.2
POLL_TIMEOUT_S = 5.0
EXIT_API, EXIT_ACCESS, EXIT_INTERRUPTED = 1, 2, 130

Url = Annotated[
    str, typer.Option("--url", envvar="SWITCHYARD_ADMIN_URL", help="The gateway's HTTP address.", show_envvar=True)
]
Token = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="SWITCHYARD_ADMIN_TOKEN",
        help="Admin bearer token: the gateway's SWITCHYARD_ADMIN_TOKEN, or an admin token of its keys file.",
        show_default=False,
        show_envvar=True,
    ),
]
Timeout = Annotated[float, typer.Option("--timeout", min=0.1, help="Seconds to wait for the gateway's answer.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print the gateway's JSON answer as it came (for scripts).")]
Model = Annotated[str, typer.Argument(help="Model name.", show_default=False)]
Version = Annotated[int, typer.Argument(min=0, help="Version number.", show_default=False)]


@dataclass(frozen=True)
class Target:
    url: str
    token: str | None
    timeout_s: float

    def client(self, timeout_s: float | None = None) -> AdminClient:
        return AdminClient(self.url, self.token, timeout_s=timeout_s or self.timeout_s)


# -- running a call -------------------------------------------------------------------------------------------
@contextmanager
def reporting(target: Target) -> Iterator[None]:
    """Turns what went wrong into one ``error:`` line and an exit code: the gateway's refusals and unreachability
    are 2 (fix the call's setup), its answers to the action 1."""
    try:
        yield
    except GatewayUnreachable as exc:
        if exc.timed_out:
            hint = "a version action may still be running there: see `switchyard models status`; or raise --timeout"
        elif exc.hint:
            hint = exc.hint
        else:
            hint = "is it running? set --url or SWITCHYARD_ADMIN_URL"
        _fail(target, f"{exc} ({hint})", EXIT_ACCESS)
    except AdminError as exc:
        step = f" [step: {exc.step}]" if exc.step and f"'{exc.step}'" not in exc.message else ""
        _fail(target, exc.message + step + _token_hint(target, exc), EXIT_ACCESS if exc.refused else EXIT_API)


def _token_hint(target: Target, exc: AdminError) -> str:
    """How to give this command the token, when the gateway refused for the want of one or for a wrong one."""
    if exc.status == 401 and not target.token:
        return "; give it with --token or the SWITCHYARD_ADMIN_TOKEN environment variable"
    if exc.status == 403 and target.token and "not valid" in exc.message:
        return f"; --token or SWITCHYARD_ADMIN_TOKEN must hold {_tokens_taken(target)}"
    return ""


TOKENS_TAKEN = re.compile(r"needs 'Authorization: Bearer <token>' \((?P<taken>[^()]+)\)$")
"""The end of the gateway's 401, which names the admin tokens it takes (its setting's, its keys file's, or both)."""
ANY_ADMIN_TOKEN = "the gateway's SWITCHYARD_ADMIN_TOKEN or an admin token of the gateway's keys file"


def _tokens_taken(target: Target) -> str:
    """The admin tokens the gateway at ``target`` takes, as its 401 to a call without a token names them: a gateway
    whose admin tokens are all in its keys file has no SWITCHYARD_ADMIN_TOKEN to point the user at. Either kind
    where the gateway does not say."""
    try:
        with AdminClient(target.url, None, timeout_s=min(target.timeout_s, POLL_TIMEOUT_S)) as client:
            client.whoami()
    except AdminError as exc:
        taken = TOKENS_TAKEN.search(exc.message) if exc.status == 401 else None
        if taken is not None:  # the gateway says "its keys file": on the CLI's line, whose it is must be said
            return taken.group("taken").replace("its ", "the gateway's ")
    except GatewayUnreachable:
        pass
    return ANY_ADMIN_TOKEN


def _fail(target: Target, message: str, code: int) -> NoReturn:
    line = " ".join(message.split())  # one line, whatever the backend's message looked like
    if target.token:  # the gateway never echoes it; a URL or a proxy error might
        line = line.replace(target.token, "<token>")
    typer.echo(f"error: {line}", err=True)
    raise typer.Exit(code)


def show(data: JSONObject, as_json: bool, view: Callable[[JSONObject], RenderableType]) -> None:
    if as_json:
        typer.echo(json.dumps(data, indent=2))
    else:
        stdout().print(view(data))


def act(target: Target, model: str, as_json: bool, call: Callable[[AdminClient], JSONObject]) -> None:
    with reporting(target), target.client() as client:
        if as_json:
            typer.echo(json.dumps(call(client), indent=2))
            return
        report = _watching(target, model, lambda: call(client))
        stdout().print(report_view(report))


def _watching(target: Target, model: str, call: Callable[[], JSONObject]) -> JSONObject:
    """Runs ``call`` on a worker thread; meanwhile polls the model's status and shows the running action's steps
    on stderr (the gateway reports a step's duration only once it has finished)."""
    outcome: list[JSONObject | Exception] = []
    done = threading.Event()

    def work() -> None:
        try:
            outcome.append(call())
        except Exception as exc:  # handed over: the main thread reports it
            outcome.append(exc)
        finally:
            done.set()

    # A daemon: after Ctrl-C the process exits at once; the gateway finishes the action anyway.
    threading.Thread(target=work, name="switchyard-admin-action", daemon=True).start()
    steps = LiveSteps(model)
    console = Console(stderr=True, highlight=False)
    try:
        with (
            target.client(min(target.timeout_s, POLL_TIMEOUT_S)) as poller,
            Live(
                steps.render(None), console=console, transient=True, redirect_stdout=False, redirect_stderr=False
            ) as live,
        ):
            polling = True
            while not done.is_set():
                if polling:
                    try:
                        live.update(steps.render(poller.model(model).get("action")))
                    except (AdminError, GatewayUnreachable):
                        polling = False  # the action's own answer says what is wrong
                done.wait(POLL_INTERVAL_S)
    except KeyboardInterrupt:
        _fail(
            target,
            f"interrupted; the action may still run on the gateway: see `switchyard models status {model}`",
            EXIT_INTERRUPTED,
        )
    result = outcome[0]
    if isinstance(result, Exception):
        raise result
    return result
