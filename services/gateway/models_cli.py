"""``switchyard models``: see and switch a running gateway's model versions through its admin API. Tables for people,
``--json`` for scripts; a failure is one ``error:`` line on stderr and a non-zero exit, never a traceback.
The root command imports this to register it: only typer, rich, httpx and the standard library at module level."""

from __future__ import annotations

from typing import Annotated

import typer

from services.gateway import traffic_cli
from services.gateway.admin_client import AdminError
from services.gateway.models_calls import (
    ACTION_TIMEOUT_S,
    DEFAULT_URL,
    READ_TIMEOUT_S,
    AsJson,
    Model,
    Target,
    Timeout,
    Token,
    Url,
    Version,
    act,
    reporting,
    show,
)
from services.gateway.models_views import events_table, models_table, scan_view, status_view

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
    models.command("traffic")(traffic_cli.traffic)
    models.command("shadow")(traffic_cli.shadow)
    app.add_typer(models, name="models")


# -- commands -------------------------------------------------------------------------------------------------
def list_models(
    url: Url = DEFAULT_URL, token: Token = None, timeout: Timeout = READ_TIMEOUT_S, as_json: AsJson = False
) -> None:
    """One line per model: routing, canary and shadow, versions loaded and on disk, problems and actions now."""
    target = Target(url, token, timeout)
    with reporting(target), target.client() as client:
        listed = client.models()
        if not as_json:
            for row in listed.get("models", []):
                if "canary" in row:
                    continue
                try:  # a gateway whose list leaves the traffic policies out: ask model by model
                    routing = client.model(str(row.get("name"))).get("routing") or {}
                except AdminError:  # gone since the list was made: its row says what the list knew
                    continue
                row.update(canary=routing.get("canary"), shadow=routing.get("shadow"))
        show(listed, as_json, models_table)


def status(
    model: Model,
    url: Url = DEFAULT_URL,
    token: Token = None,
    timeout: Timeout = READ_TIMEOUT_S,
    as_json: AsJson = False,
) -> None:
    """A model's routing, loaded versions, versions on disk, the action in progress and the last one."""
    target = Target(url, token, timeout)
    with reporting(target), target.client() as client:
        show(client.model(model), as_json, status_view)


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
    with reporting(target), target.client() as client:
        show(client.events(model, limit), as_json, events_table)


def scan(
    url: Url = DEFAULT_URL, token: Token = None, timeout: Timeout = ACTION_TIMEOUT_S, as_json: AsJson = False
) -> None:
    """Read the repository again: new models are loaded and routed, new versions wait for an activate."""
    target = Target(url, token, timeout)
    with reporting(target), target.client() as client:
        show(client.scan(), as_json, scan_view)


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
    act(
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
    act(
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
    act(Target(url, token, timeout), model, as_json, lambda c: c.load(model, version))


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
    act(Target(url, token, timeout), model, as_json, lambda c: c.unload(model, version, drain_timeout_s=drain_timeout))
