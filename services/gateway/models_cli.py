"""``switchyard models``: see and switch a running gateway's model versions through its admin API. Tables for people,
``--json`` for scripts; a failure is one ``error:`` line on stderr and a non-zero exit, never a traceback.
The root command imports this to register it: only typer, rich, httpx and the standard library at module level."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, NoReturn

import typer
from rich.console import Console, RenderableType
from rich.live import Live

from services.gateway.admin_client import DEFAULT_URL, AdminClient, AdminError, GatewayUnreachable, JSONObject
from services.gateway.models_views import (
    LiveSteps,
    events_table,
    models_table,
    report_view,
    scan_view,
    status_view,
    stdout,
)

__all__ = ["register"]

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
        help="Admin bearer token (the gateway's SWITCHYARD_ADMIN_TOKEN).",
        show_default=False,
        show_envvar=True,
    ),
]
Timeout = Annotated[float, typer.Option("--timeout", min=0.1, help="Seconds to wait for the gateway's answer.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print the gateway's JSON answer as it came (for scripts).")]
Model = Annotated[str, typer.Argument(help="Model name.", show_default=False)]
Version = Annotated[int, typer.Argument(min=0, help="Version number.", show_default=False)]
KeepPrevious = Annotated[
    bool | None,
    typer.Option(
        "--keep-previous/--no-keep-previous",
        help="Keep the replaced version loaded for an instant rollback (the gateway's default: keep).",
        show_default=False,
    ),
]
DrainTimeout = Annotated[
    float | None,
    typer.Option(
        "--drain-timeout",
        min=0,
        help="Seconds to wait for the replaced version's requests to finish (default: the gateway's).",
        show_default=False,
    ),
]
Compare = Annotated[
    bool | None,
    typer.Option(
        "--compare/--no-compare",
        help="Run the same samples on both versions and report the largest difference per output.",
        show_default=False,
    ),
]


def register(app: typer.Typer) -> None:
    models = typer.Typer(help="See and switch the model versions a running gateway serves.", no_args_is_help=True)
    models.command("list")(list_models)
    models.command("status")(status)
    models.command("activate")(activate)
    models.command("rollback")(rollback)
    models.command("load")(load)
    models.command("unload")(unload)
    models.command("events")(events)
    models.command("scan")(scan)
    app.add_typer(models, name="models")


@dataclass(frozen=True)
class Target:
    url: str
    token: str | None
    timeout_s: float

    def client(self, timeout_s: float | None = None) -> AdminClient:
        return AdminClient(self.url, self.token, timeout_s=timeout_s or self.timeout_s)


# -- commands -------------------------------------------------------------------------------------------------
def list_models(
    url: Url = DEFAULT_URL, token: Token = None, timeout: Timeout = READ_TIMEOUT_S, as_json: AsJson = False
) -> None:
    """One line per model: routing, versions loaded and on disk, problems and actions in progress."""
    target = Target(url, token, timeout)
    with _reporting(target), target.client() as client:
        _show(client.models(), as_json, models_table)


def status(
    model: Model,
    url: Url = DEFAULT_URL,
    token: Token = None,
    timeout: Timeout = READ_TIMEOUT_S,
    as_json: AsJson = False,
) -> None:
    """A model's routing, loaded versions, versions on disk, the action in progress and the last one."""
    target = Target(url, token, timeout)
    with _reporting(target), target.client() as client:
        _show(client.model(model), as_json, status_view)


def events(
    model: Model,
    limit: Annotated[
        int | None, typer.Option(help="How many of the newest events to show (default: the gateway's).")
    ] = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
    timeout: Timeout = READ_TIMEOUT_S,
    as_json: AsJson = False,
) -> None:
    """A model's audit log: every version action, its result, step timings and who asked."""
    target = Target(url, token, timeout)
    with _reporting(target), target.client() as client:
        _show(client.events(model, limit), as_json, events_table)


def scan(
    url: Url = DEFAULT_URL, token: Token = None, timeout: Timeout = ACTION_TIMEOUT_S, as_json: AsJson = False
) -> None:
    """Read the repository again: new models are loaded and routed, new versions wait for an activate."""
    target = Target(url, token, timeout)
    with _reporting(target), target.client() as client:
        _show(client.scan(), as_json, scan_view)


def activate(
    model: Model,
    version: Version,
    keep_previous: KeepPrevious = None,
    drain_timeout: DrainTimeout = None,
    compare: Compare = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
    timeout: Timeout = ACTION_TIMEOUT_S,
    as_json: AsJson = False,
) -> None:
    """Load VERSION beside the serving one, warm it up, flip unversioned requests to it, drain the old one."""
    _act(
        Target(url, token, timeout),
        model,
        as_json,
        lambda c: c.activate(
            model, version, keep_previous=keep_previous, drain_timeout_s=drain_timeout, compare=compare
        ),
    )


def rollback(
    model: Model,
    keep_previous: KeepPrevious = None,
    drain_timeout: DrainTimeout = None,
    compare: Compare = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
    timeout: Timeout = ACTION_TIMEOUT_S,
    as_json: AsJson = False,
) -> None:
    """Make the previous version stable again (instant when it is still loaded)."""
    _act(
        Target(url, token, timeout),
        model,
        as_json,
        lambda c: c.rollback(model, keep_previous=keep_previous, drain_timeout_s=drain_timeout, compare=compare),
    )


def load(
    model: Model,
    version: Version,
    url: Url = DEFAULT_URL,
    token: Token = None,
    timeout: Timeout = ACTION_TIMEOUT_S,
    as_json: AsJson = False,
) -> None:
    """Load and warm up VERSION without routing to it (reachable as /versions/VERSION)."""
    _act(Target(url, token, timeout), model, as_json, lambda c: c.load(model, version))


def unload(
    model: Model,
    version: Version,
    drain_timeout: DrainTimeout = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
    timeout: Timeout = ACTION_TIMEOUT_S,
    as_json: AsJson = False,
) -> None:
    """Drain VERSION's requests and unload it (not the stable version: activate another one first)."""
    _act(Target(url, token, timeout), model, as_json, lambda c: c.unload(model, version, drain_timeout_s=drain_timeout))


# -- running a call -------------------------------------------------------------------------------------------
@contextmanager
def _reporting(target: Target) -> Iterator[None]:
    """Turns what went wrong into one ``error:`` line and an exit code: the gateway's refusals and unreachability
    are 2 (fix the call's setup), its answers to the action 1."""
    try:
        yield
    except GatewayUnreachable as exc:
        if exc.timed_out:
            hint = "a version action may still be running there: see `switchyard models status`; or raise --timeout"
        else:
            hint = "is it running? set --url or SWITCHYARD_ADMIN_URL"
        _fail(target, f"{exc} ({hint})", EXIT_ACCESS)
    except AdminError as exc:
        step = f" [step: {exc.step}]" if exc.step and f"'{exc.step}'" not in exc.message else ""
        _fail(target, exc.message + step, EXIT_ACCESS if exc.refused else EXIT_API)


def _fail(target: Target, message: str, code: int) -> NoReturn:
    line = " ".join(message.split())  # one line, whatever the backend's message looked like
    if target.token:  # the gateway never echoes it; a URL or a proxy error might
        line = line.replace(target.token, "<token>")
    typer.echo(f"error: {line}", err=True)
    raise typer.Exit(code)


def _show(data: JSONObject, as_json: bool, view: Callable[[JSONObject], RenderableType]) -> None:
    if as_json:
        typer.echo(json.dumps(data, indent=2))
    else:
        stdout().print(view(data))


def _act(target: Target, model: str, as_json: bool, call: Callable[[AdminClient], JSONObject]) -> None:
    with _reporting(target), target.client() as client:
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
