"""``switchyard models traffic`` and ``switchyard models shadow``: set or clear a model's canary split and shadow
version through the admin API. Only the options given are sent: the gateway applies its defaults and its checks, so
a value it refuses comes back as its own message (exit 1); options that do not go together are a usage error (2)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

import typer
from typer.models import OptionInfo

from services.ops.admin_command import AdminCall, admin_command
from services.ops.calls import ACTION_TIMEOUT_S, Model

__all__ = ["shadow", "traffic"]

_HELP = {
    "--canary": "The version to send a share of traffic to.",
    "--weight": "Percent (0-100) of unversioned requests for the canary; 0 clears.",
    "--sticky-header": "Split by this request header's value: the same value always lands on the same side.",
    "--max-error-rate": "Pull the canary back when its 5xx rate over the window passes this fraction (e.g. 0.05).",
    "--max-p99-ratio": "Pull the canary back when its p99 passes this many times the stable version's.",
    "--window": "Seconds of traffic the bounds judge (default: the gateway's).",
    "--min-requests": "Requests each side needs in the window before a bound is judged (default: the gateway's).",
    "--promote-after": "Seconds without a broken bound after which the canary is activated as the stable version.",
    "--version": "The version that also runs a share of requests.",
    "--percent": "Percent (0-100) of unversioned requests to also run on it, as --weight is for a canary; 0 stops.",
    "--sample": "Deprecated: the same share as a fraction (0.0-1.0); give --percent.",
}


def _given(flag: str) -> OptionInfo:
    """An option sent only when given: its default, None, is no value to show in the help."""
    option: OptionInfo = typer.Option(flag, help=_HELP[flag], show_default=False)
    return option


Clear = Annotated[bool, typer.Option("--clear", help="Remove the policy (the version stays loaded).")]


@admin_command(ACTION_TIMEOUT_S)
def traffic(
    call: AdminCall,
    model: Model,
    canary: Annotated[int | None, _given("--canary")] = None,
    weight: Annotated[float | None, _given("--weight")] = None,
    sticky_header: Annotated[str | None, _given("--sticky-header")] = None,
    max_error_rate: Annotated[float | None, _given("--max-error-rate")] = None,
    max_p99_ratio: Annotated[float | None, _given("--max-p99-ratio")] = None,
    window: Annotated[float | None, _given("--window")] = None,
    min_requests: Annotated[int | None, _given("--min-requests")] = None,
    promote_after: Annotated[float | None, _given("--promote-after")] = None,
    clear: Clear = False,
) -> None:
    """Send --weight percent of unversioned requests to --canary (loaded and warmed up first), or --clear the split.

    The gateway sets the weight to 0 by itself when the canary breaks a bound (--max-error-rate, --max-p99-ratio)."""
    options = {
        "--canary": canary,
        "--weight": weight,
        "--sticky-header": sticky_header,
        "--max-error-rate": max_error_rate,
        "--max-p99-ratio": max_p99_ratio,
        "--window": window,
        "--min-requests": min_requests,
        "--promote-after": promote_after,
    }
    if clear:
        _alone(options)
    elif canary is None or weight is None:
        raise typer.BadParameter("give both --canary and --weight (or --clear)", param_hint="--canary / --weight")
    elif max_error_rate is None and max_p99_ratio is None and (window is not None or min_requests is not None):
        raise typer.BadParameter(
            "--window and --min-requests tune a rollback bound: give --max-error-rate and/or --max-p99-ratio too",
            param_hint="--window / --min-requests",
        )
    call.act(
        model,
        lambda client: client.traffic(
            model,
            None if clear else canary,
            _plain(weight),
            sticky_header=sticky_header,
            max_error_rate=max_error_rate,
            max_p99_ratio=max_p99_ratio,
            window_s=window,
            min_requests=min_requests,
            promote_after_s=promote_after,
        ),
    )


@admin_command(ACTION_TIMEOUT_S)
def shadow(
    call: AdminCall,
    model: Model,
    version: Annotated[int | None, _given("--version")] = None,
    percent: Annotated[float | None, _given("--percent")] = None,
    sample: Annotated[float | None, typer.Option("--sample", help=_HELP["--sample"], hidden=True)] = None,
    clear: Clear = False,
) -> None:
    """Also run --percent of unversioned requests on --version (loaded and warmed up first), or --clear it.

    Its answers are compared with the stable version's and never sent; shadow work never delays a client."""
    if sample is not None:
        if percent is not None:
            raise typer.BadParameter("give --percent alone (--sample is its deprecated fraction)",
                                     param_hint="--sample")
        typer.echo(f"note: --sample is deprecated; --sample {sample:g} is --percent {sample * 100:g}", err=True)
        percent = sample * 100
    if clear:
        _alone({"--version": version, "--percent": percent})
    elif version is None or percent is None:
        raise typer.BadParameter("give both --version and --percent (or --clear)", param_hint="--version / --percent")
    call.act(model, lambda client: client.shadow(model, None if clear else version, _plain(percent)))


def _plain(value: float | None) -> float | None:
    """``30`` rather than ``30.0`` in the request: the gateway's messages quote what it was sent."""
    return int(value) if value is not None and value.is_integer() else value


def _alone(options: Mapping[str, object]) -> None:
    given = [name for name, value in options.items() if value is not None]
    if given:
        raise typer.BadParameter(f"it removes the whole policy: leave out {', '.join(given)}", param_hint="--clear")
