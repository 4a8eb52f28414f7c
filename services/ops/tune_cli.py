"""``switchyard tune``: asks a running gateway to tune a model (``POST /admin/models/{m}/tune``), follows the run,
then prints the trial table, draws the Pareto front as a PNG and says what won. A run without a winner (an SLO no
setting meets) is an ``error:`` line naming the best p99 seen, and exit code 1. The command follows its own run by the
id the gateway gave it (``?run=<id>``), and Ctrl-C cancels that run and no other
(``DELETE /admin/models/{m}/tune?run=<id>``), says what that did, and exits 130. Only typer, rich, httpx and the
standard library at module level: the root command imports this to register it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated
from urllib.parse import quote

import typer
from rich.console import Console
from rich.live import Live

from services.extras import MissingExtra
from services.ops.calls import DEFAULT_URL, EXIT_API, AsJson, Model, Target, Token, Url, reporting
from services.ops.client import AdminClient, AdminError, GatewayUnreachable, JSONObject
from services.ops.format import stdout
from services.ops.tune_plot import pareto_png
from services.ops.tune_views import cancelled_line, progress_line, summary_lines, trials_table

__all__ = ["TuneClient", "register"]

POLL_INTERVAL_S = 0.5
EXIT_INTERRUPTED = 130
SLACK_S = 120.0
"""How much longer than its budget the CLI waits for a run (the last trial's unload, the write)."""
CANCEL_TIMEOUT_S = 120.0
"""How long Ctrl-C waits for the gateway to confirm the cancel: it answers once the trial in progress has finished
loading (if it was loading) and every trial is unloaded (Triton, in place: the serving config loaded back)."""


class TuneClient(AdminClient):
    """The admin client with the tuning routes."""

    def tune(self, model: str, options: JSONObject) -> JSONObject:
        return self._call("POST", f"/admin/models/{_quoted(model)}/tune", body=options)

    def tune_status(self, model: str, run: str | None = None) -> JSONObject:
        """The model's current run, or (``run``) the run of that id."""
        return self._call("GET", f"/admin/models/{_quoted(model)}/tune{_run_query(run)}")

    def tune_cancel(self, model: str, run: str | None = None) -> JSONObject:
        """Answers once the run has stopped and its trials are unloaded; ``run``: only that run (409 when it is not
        the model's current one)."""
        return self._call("DELETE", f"/admin/models/{_quoted(model)}/tune{_run_query(run)}")


def register(app: typer.Typer) -> None:
    app.command()(tune)


def tune(
    model: Model,
    p99_ms: Annotated[float, typer.Option("--p99-ms", help="The SLO: p99 latency in ms at every concurrency.")],
    version: Annotated[
        int | None, typer.Option(min=0, help="Version to tune (default: the one serving).", show_default=False)
    ] = None,
    concurrency: Annotated[str, typer.Option(help="Closed-loop client counts, comma-separated.")] = "1,8,32",
    duration: Annotated[float, typer.Option(help="Measured seconds per concurrency level.")] = 2.0,
    budget_s: Annotated[float, typer.Option("--budget-s", help="Wall-clock limit of the whole run.")] = 120.0,
    write: Annotated[bool, typer.Option(help="Publish the winner as the model's config.pbtxt.")] = False,
    in_place: Annotated[
        bool, typer.Option(help="Run trials on the serving model itself (Triton only; affects production).")
    ] = False,
    candidate: Annotated[
        list[str] | None,
        typer.Option(
            help="Measure just these settings, as the trial table names them ('i2 d500us p[8] b32'); repeatable.",
            show_default=False,
        ),
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="Where to draw the Pareto front (default: tune-MODEL.png).", show_default=False)
    ] = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Find the instance count, batch queue delay, preferred batch sizes and max batch size that meet a p99 SLO at
    the highest throughput, on the running gateway's backend; trials load beside the serving version."""
    try:
        levels = [int(part) for part in concurrency.split(",") if part.strip()]
    except ValueError:
        message = "a comma-separated list of integers, e.g. 1,8,32"
        raise typer.BadParameter(message, param_hint="--concurrency") from None
    options: JSONObject = {
        "p99_ms": p99_ms,
        "concurrency": levels,
        "duration_s": duration,
        "budget_s": budget_s,
        "write": write,
        "in_place": in_place,
    } | ({"version": version} if version is not None else {}) | ({"candidates": candidate} if candidate else {})
    target = Target(url, token, 30.0)
    with reporting(target):
        client = TuneClient(url, token, timeout_s=30.0)
        try:
            try:
                started = client.tune(model, options)
            except KeyboardInterrupt:  # whether the gateway started it is unknown: cancel nothing blindly
                typer.echo(f"interrupted before the gateway answered; if a run started, `{_status_hint(model)}` "
                           f"shows it and DELETE on that path cancels it", err=True)
                raise typer.Exit(EXIT_INTERRUPTED) from None
            run = _follow(client, target, model, started, budget_s + SLACK_S, as_json)
        finally:
            client.close()
    _report(run, plot or Path(f"tune-{model}.png"), as_json)
    if run["status"] != "succeeded":
        typer.echo(f"error: {run.get('error') or run['status']}", err=True)
        raise typer.Exit(EXIT_API)


def _follow(
    client: TuneClient, target: Target, model: str, run: JSONObject, wait_s: float, quiet: bool
) -> JSONObject:
    """Polls this command's run by its id: a run someone else starts on the model once it ends is not this one."""
    console = Console(stderr=True, highlight=False)
    deadline = time.monotonic() + wait_s
    run_id = run.get("id")
    try:
        with Live(progress_line(run), console=console, transient=True, redirect_stdout=False) as live:
            while run["status"] == "running":
                if time.monotonic() > deadline:
                    raise GatewayUnreachable(client.url, f"the run did not end within {wait_s:g} s", timed_out=True)
                time.sleep(POLL_INTERVAL_S)
                run = client.tune_status(model, run_id)
                if not quiet:
                    live.update(progress_line(run))
    except KeyboardInterrupt:
        _cancel(target, model, run_id)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    return run


def _cancel(target: Target, model: str, run_id: str | None) -> None:
    """Ctrl-C: the run stops on the gateway too (a run left going would keep loading trials beside production for
    the rest of its budget); one line on stderr says what happened to it. Only this command's run: the DELETE names
    its id, so a run someone else started once this one ended is left alone (the gateway answers 409)."""
    if run_id is None:  # a gateway that gives runs no id: a DELETE could only name the model, whoever's run it has
        typer.echo(f"interrupted: the gateway gave this run no id, so it is not cancelled blindly: "
                   f"`{_status_hint(model)}` shows it and DELETE on that path cancels the model's run", err=True)
        return
    typer.echo(f"interrupted: cancelling tuning run {run_id} of '{model}' on the gateway...", err=True)
    canceller = TuneClient(target.url, target.token, timeout_s=CANCEL_TIMEOUT_S)
    try:
        run = canceller.tune_cancel(model, run_id)
    except KeyboardInterrupt:
        typer.echo(f"interrupted again before the gateway confirmed the cancel: `{_status_hint(model, run_id)}` shows "
                   f"whether the run ended", err=True)
        return
    except AdminError as exc:  # 409: it ended meanwhile (another run may have started); 404: the gateway restarted
        typer.echo(f"not cancelled: {exc.message}", err=True)
        return
    except GatewayUnreachable as exc:
        if exc.timed_out:  # the gateway took the cancel and is still unloading
            typer.echo(f"not confirmed within {CANCEL_TIMEOUT_S:g} s: the gateway is still stopping the run; "
                       f"`{_status_hint(model, run_id)}` shows when it has", err=True)
        else:
            typer.echo(f"not cancelled: {exc}; the run may go on in the gateway: `{_status_hint(model, run_id)}` "
                       f"shows it, DELETE on that path cancels it", err=True)
        return
    finally:
        canceller.close()
    typer.echo(cancelled_line(run), err=True)


def _status_hint(model: str, run_id: str | None = None) -> str:
    return f"GET /admin/models/{_quoted(model)}/tune{_run_query(run_id)}"


def _run_query(run_id: str | None) -> str:
    return f"?run={quote(run_id, safe='')}" if run_id is not None else ""


def _report(run: JSONObject, plot: Path, as_json: bool) -> None:
    """The table and verdict on stdout (``--json``: the run's JSON there instead, the rest on stderr)."""
    out = Console(stderr=True, highlight=False) if as_json else stdout()
    if as_json:
        typer.echo(json.dumps(run, indent=2))
    else:
        out.print(trials_table(run))
        for line in summary_lines(run):
            out.print(line, highlight=False)
    if any(trial["measurements"] for trial in run.get("trials", [])):
        try:
            out.print(f"Pareto front: {pareto_png(run, plot)}", highlight=False)
        except MissingExtra as exc:  # the table and the verdict stand without the picture
            out.print(f"no plot: {exc}", highlight=False)


def _quoted(model: str) -> str:
    return quote(model, safe="")

