"""The CLI's rendering of a tuning run, from the admin API's JSON: the trial table and the closing lines."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from services.ops import format as fmt

JSONObject = dict[str, Any]


def trials_table(run: JSONObject) -> Table:
    """One row per trial and concurrency level: settings, throughput, p50/p99, server CPU per request."""
    slo = float(run["options"]["p99_ms"])
    winner = (run.get("winner") or {}).get("number")
    front = set(run.get("pareto_front") or [])
    table = Table(title=f"tuning '{run['model']}' version {run['version']}: p99 <= {slo:g} ms", title_justify="left")
    for column in ("#", "round", "settings", "clients", "req/s", "p50 ms", "p99 ms", "cpu ms/req", "note"):
        table.add_column(column, justify="left" if column in ("settings", "note") else "right")
    for trial in run.get("trials", []):
        notes = [n for n, on in (("winner", trial["number"] == winner), ("current", trial["default"])) if on]
        notes += ["front"] if trial["number"] in front else []
        if trial.get("error"):
            table.add_row(str(trial["number"]), str(trial["round"]), trial["label"], "", "", "", "", "", trial["error"])
            continue
        for index, m in enumerate(trial["measurements"]):
            met = m["p99_ms"] is not None and m["p99_ms"] <= slo and not m["errors"]
            p99 = Text(_ms(m["p99_ms"]), style="green" if met else "red")
            note = (", ".join(notes) if index == 0 else "") + (f" {m['errors']} errors" if m["errors"] else "")
            table.add_row(
                str(trial["number"]) if index == 0 else "",
                str(trial["round"]) if index == 0 else "",
                trial["label"] if index == 0 else "",
                str(m["concurrency"]),
                f"{m['throughput']:.0f}",
                _ms(m["p50_ms"]),
                p99,
                f"{m['cpu_ms_per_request']:.3f}",
                note.strip(),
            )
    return fmt.whole(table)


def summary_lines(run: JSONObject) -> list[str]:
    lines = []
    curve = (run.get("curve") or {}).get("latency_ms") or {}
    if curve:
        points = ", ".join(f"{size}: {ms:.2f}" for size, ms in curve.items())
        lines.append(f"batch-latency curve (rows: ms): {points}")
    winner, defaults = run.get("winner"), run.get("defaults")
    if winner is not None:
        lines.append(_trial_line("winner", winner, run["winner_throughput"], run.get("winner_worst_p99_ms")))
    if defaults is not None:
        lines.append(
            _trial_line("current config.pbtxt", defaults, run["defaults_throughput"], run.get("defaults_worst_p99_ms"))
        )
    published = run.get("published")
    if published:
        lines.append(f"written: {published['config']} (old one: {published['backup']}; trials: {published['table']})")
        lines.append("it applies when the model is next loaded (`switchyard models load|activate`)")
    elif winner is not None:
        lines.append("nothing written: run again with --write to publish the winner as config.pbtxt")
    lines.append(f"{len(run.get('trials', []))} trials in {run.get('duration_s') or run.get('elapsed_s')} s")
    return lines


def cancelled_line(run: JSONObject) -> str:
    """What a cancel did, from the run it answered with: when, in which phase, the trial it ended, what is left. An
    in-place run whose serving config could not be loaded back is an ``error:`` line saying what Triton serves."""
    cancelled = run.get("cancelled") or {}
    stopped = cancelled.get("stopped")
    trials = len(run.get("trials", []))
    measured = f"{trials} trial{'s' if trials != 1 else ''} measured"
    phase = cancelled.get("phase") or run.get("phase")
    restore = run.get("serving_config") or {}
    if restore.get("restored") is False:
        return (
            f"error: tuning run {run.get('id')} of '{run['model']}' stopped while {phase}"
            + (f"; {stopped} was ended" if stopped else "")
            + f"; {measured}, nothing written; but the serving config could not be loaded back into Triton "
            f"({restore['attempts']} attempts): {restore['error']}; {restore['serving_now']}"
        )
    return (
        f"cancelled: the tuning run of '{run['model']}' stopped while {phase}"
        + (f"; {stopped} was ended and unloaded" if stopped else "")
        + f"; {measured}, none left loaded, nothing written"
    )


def progress_line(run: JSONObject) -> str:
    done = len(run.get("trials", []))
    return (
        f"tuning '{run['model']}': {run.get('phase')} - trial {done}/{run.get('planned_trials') or '?'}, "
        f"{run.get('elapsed_s', 0):.0f} of {run['options']['budget_s']:g} s"
    )


def _trial_line(title: str, trial: dict[str, Any], throughput: float, worst_p99_ms: float | None) -> str:
    """Both figures over every run of the trial's settings (a gateway older than the worst-p99 field: the trial's own
    run)."""
    measurements = trial["measurements"]
    p99s = [m["p99_ms"] for m in measurements]
    worst = worst_p99_ms if worst_p99_ms is not None or None in p99s else max(p99s, default=None)
    return (
        f"{title}: trial {trial['number']} {trial['label']}: {throughput:.0f} req/s at "
        f"{measurements[-1]['concurrency']} clients (mean of its runs), "
        + (f"worst p99 {worst:.2f} ms (of its runs)" if worst is not None else "no p99: a level answered no request")
    )


def _ms(value: float | None) -> str:
    """A latency the API sent; null where no request of the measurement was answered (its errors column says why)."""
    return "-" if value is None else f"{value:.2f}"
