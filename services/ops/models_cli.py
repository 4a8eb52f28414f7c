"""``switchyard models``: see and switch a running gateway's model versions through its admin API. Tables for people,
``--json`` for scripts; a failure is one ``error:`` line on stderr and a non-zero exit, never a traceback.
The root command imports this to register it: only typer, rich, httpx and the standard library at module level."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated

import typer

from services.ops import traffic_cli
from services.ops.admin_command import AdminCall, admin_command
from services.ops.calls import ACTION_TIMEOUT_S, READ_TIMEOUT_S, Model, Version
from services.ops.client import AdminClient, AdminError, JSONObject
from services.ops.models_views import events_table, models_table, scan_view, status_view

__all__ = ["register"]

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
UnloadDrainTimeout = Annotated[
    float | None,
    typer.Option(
        "--drain-timeout",
        min=0,
        help="Seconds to wait for VERSION's requests in flight to finish before it is unloaded (default: the "
        "gateway's).",
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


@dataclass(frozen=True)
class Switch:
    """How ``activate`` and ``rollback`` switch the stable version; an option left out leaves the gateway's default."""

    keep_previous: KeepPrevious = None
    drain_timeout: DrainTimeout = None
    compare: Compare = None


@dataclass(frozen=True)
class ReplayCheck:
    """``activate --verify-replay``: the gateway replays logged requests on the new version before the flip and
    refuses it when the answers differ; options left out take the gateway's defaults."""

    verify_replay: Annotated[
        str | None,
        typer.Option(
            "--verify-replay",
            help="Before the flip, replay the newest logged requests (an inference log directory or redis:// URL "
            "the gateway reads) on VERSION and refuse it when its answers differ.",
            show_default=False,
        ),
    ] = None
    replay_limit: Annotated[
        int | None,
        typer.Option(
            "--replay-limit", min=1, help="How many of the newest records (default: 200).", show_default=False
        ),
    ] = None
    atol: Annotated[
        float | None,
        typer.Option("--atol", min=0, help="Replay: absolute tolerance (default: 1e-5).", show_default=False),
    ] = None
    rtol: Annotated[
        float | None,
        typer.Option("--rtol", min=0, help="Replay: relative tolerance (default: 1e-4).", show_default=False),
    ] = None

    def option(self) -> JSONObject | None:
        """The admin API's ``verify_replay`` object; ``None`` without ``--verify-replay``."""
        if self.verify_replay is None:
            if any(value is not None for value in (self.replay_limit, self.atol, self.rtol)):
                raise typer.BadParameter("--replay-limit, --atol and --rtol go with --verify-replay SOURCE")
            return None
        given = {"limit": self.replay_limit, "atol": self.atol, "rtol": self.rtol}
        return {"source": self.verify_replay} | {key: value for key, value in given.items() if value is not None}


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
    models.command("traffic")(traffic_cli.traffic)
    models.command("shadow")(traffic_cli.shadow)
    app.add_typer(models, name="models")


# -- commands -------------------------------------------------------------------------------------------------
@admin_command(READ_TIMEOUT_S)
def list_models(call: AdminCall) -> None:
    """One line per model: routing, canary and shadow, versions loaded and on disk, problems and actions now."""
    # --json prints the gateway's answer as it came; the table also shows each model's traffic policies.
    call.show(lambda client: client.models() if call.as_json else _with_policies(client), models_table)


@admin_command(READ_TIMEOUT_S)
def status(call: AdminCall, model: Model) -> None:
    """A model's routing, loaded versions, versions on disk, the action in progress and the last one."""
    call.show(lambda client: client.model(model), status_view)


@admin_command(READ_TIMEOUT_S)
def events(
    call: AdminCall,
    model: Model,
    limit: Annotated[
        int | None, typer.Option(help="How many of the newest events to show (default: the gateway's).")
    ] = None,
) -> None:
    """A model's audit log: every version action, its result, step timings and who asked."""
    call.show(lambda client: client.events(model, limit), events_table)


@admin_command(ACTION_TIMEOUT_S)
def scan(call: AdminCall) -> None:
    """Read the repository again: new models are loaded and routed, new versions wait for an activate."""
    call.show(lambda client: client.scan(), scan_view)


@admin_command(ACTION_TIMEOUT_S)
def activate(call: AdminCall, model: Model, version: Version, switch: Switch, check: ReplayCheck) -> None:
    """Load VERSION beside the serving one, warm it up, flip unversioned requests to it, drain the old one."""
    verify_replay = check.option()
    outcome: list[JSONObject | AdminError] = []

    def run(client: AdminClient) -> JSONObject:
        try:
            answer = client.activate(
                model,
                version,
                keep_previous=switch.keep_previous,
                drain_timeout_s=switch.drain_timeout,
                compare=switch.compare,
                verify_replay=verify_replay,
            )
        except AdminError as exc:
            outcome.append(exc)
            raise
        outcome.append(answer)
        return answer

    try:
        call.act(model, run)
    finally:
        if verify_replay is not None and outcome:
            _show_replay(outcome[0], call.as_json)


@admin_command(ACTION_TIMEOUT_S)
def rollback(call: AdminCall, model: Model, switch: Switch) -> None:
    """Make the previous version stable again (instant when it is still loaded)."""
    call.act(
        model,
        lambda client: client.rollback(
            model, keep_previous=switch.keep_previous, drain_timeout_s=switch.drain_timeout, compare=switch.compare
        ),
    )


@admin_command(ACTION_TIMEOUT_S)
def load(call: AdminCall, model: Model, version: Version) -> None:
    """Load and warm up VERSION without routing to it (reachable as /versions/VERSION)."""
    call.act(model, lambda client: client.load(model, version))


@admin_command(ACTION_TIMEOUT_S)
def unload(call: AdminCall, model: Model, version: Version, drain_timeout: UnloadDrainTimeout = None) -> None:
    """Drain VERSION's requests and unload it (not the stable version: activate another one first)."""
    call.act(model, lambda client: client.unload(model, version, drain_timeout_s=drain_timeout))


def _show_replay(outcome: JSONObject | AdminError, as_json: bool) -> None:
    """The replay check's report: after the action's report (its JSON already holds it), or after the error line
    of a refusal (on stdout as JSON with --json, for scripts)."""
    refused = isinstance(outcome, AdminError)
    replay = outcome.details.get("replay") if isinstance(outcome, AdminError) else outcome.get("replay")
    if not isinstance(replay, dict) or (as_json and not refused):
        return
    if as_json:
        typer.echo(json.dumps({"replay": replay}, indent=2))
        return
    from services.inferlog.compare import render_report  # numpy: only when there is a report to show

    typer.echo(render_report(replay), err=refused)


def _with_policies(client: AdminClient) -> JSONObject:
    """The model list with each row's canary and shadow policies."""
    listed = client.models()
    for row in listed.get("models", []):
        if "canary" in row:
            continue
        try:  # a gateway whose list leaves the traffic policies out: ask model by model
            routing = client.model(str(row.get("name"))).get("routing") or {}
        except AdminError:  # gone since the list was made: its row says what the list knew
            continue
        row.update(canary=routing.get("canary"), shadow=routing.get("shadow"))
    return listed
