"""How ``switchyard models`` shows what the admin API answers: rich tables and the live view of a running action."""

from __future__ import annotations

import time
from typing import Any, Literal

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from services.ops import format as fmt
from services.ops import traffic_views
from services.ops.client import JSONObject


class LiveSteps:
    """The live view: finished steps with their durations, and the running one with how long it has run so far
    (timed here, from when a poll first saw it)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self._step: str | None = None
        self._since = time.monotonic()

    def render(self, progress: JSONObject | None) -> RenderableType:
        if progress is None:
            return Text(f"{self.model}: waiting for the gateway …", style="dim")
        step = str(progress.get("step"))
        if step != self._step:
            self._step, self._since = step, time.monotonic()
        grid = Table.grid(padding=(0, 2))
        for name, seconds in fmt.durations(progress.get("steps")):
            grid.add_row(Text("✓", style="green"), Text(name), Text(fmt.ms(seconds), justify="right"))
        finished = progress.get("steps") or {}
        if step not in finished:  # the gateway moves ``step`` on only when the next one starts
            elapsed = f"{time.monotonic() - self._since:.1f} s"
            grid.add_row(Text("…", style="yellow"), Text(step, style="bold"), Text(elapsed))
        version = progress.get("version")  # none when a traffic policy is cleared
        title = f"{progress.get('action')} {self.model}" + ("" if version is None else f" version {version}")
        return fmt.whole(Group(Text(title, style="bold"), grid))


def models_table(data: JSONObject) -> RenderableType:
    rows = data.get("models", [])
    # The traffic column only when some model has a canary or a shadow: the usual table stays as it was.
    split = [traffic_views.compact(row.get("canary"), row.get("shadow")) for row in rows]
    table = Table("model", "ready", "stable", "previous", "generation", "loaded", "on disk", "problem / action now")
    if any(split):
        table.add_column("canary / shadow")
    for row, traffic in zip(rows, split, strict=True):
        note = Text(str(row["problem"]), style="red") if row.get("problem") else Text(fmt.running(row.get("action")))
        table.add_row(
            Text(str(row.get("name"))),
            fmt.yes_no(row.get("ready")),
            Text(fmt.v(row.get("stable"))),
            Text(fmt.v(row.get("previous"))),
            Text(fmt.v(row.get("generation"))),
            Text(fmt.listed(row.get("loaded"))),
            Text(fmt.listed(row.get("available"))),
            note,
            *([Text(traffic)] if any(split) else []),
        )
    return fmt.whole(table)


def status_view(data: JSONObject) -> RenderableType:
    routing = data.get("routing") or {}
    ready = Text("ready", style="green") if data.get("ready") else Text("not ready", style="red")
    head = Text.assemble((str(data.get("name")), "bold"), f"  ({data.get('platform')})  ", ready)
    facts = Table.grid(padding=(0, 2))
    if routing:
        facts.add_row(
            "routing",
            f"stable {fmt.v(routing.get('stable'))}, previous {fmt.v(routing.get('previous'))}, "
            f"generation {fmt.v(routing.get('generation'))}, updated {fmt.when(routing.get('updated_at'))}",
        )
    else:
        facts.add_row("routing", Text("none: unversioned requests are not served", style="red"))
    traffic = data.get("traffic") or {}
    traffic_views.policy_rows(facts, traffic.get("canary"), traffic.get("shadow"))
    window = traffic_views.window_table(traffic.get("canary"), routing.get("stable"))
    if data.get("problem"):
        facts.add_row("problem", Text(str(data["problem"]), style="red"))
    loaded = Table("version", "state", "leases", "on disk", "problem / note", title="loaded versions",
                   title_justify="left")
    for row in data.get("loaded", []):
        role = {routing.get("stable"): " (stable)", routing.get("previous"): " (previous)"}.get(row.get("version"), "")
        loaded.add_row(
            Text(f"{fmt.v(row.get('version'))}{role}"),
            Text(str(row.get("state"))),
            Text(fmt.v(row.get("leases"))),
            fmt.yes_no(row.get("on_disk")),
            _problem_or_note(row),
        )
    loaded_versions = {row.get("version") for row in data.get("loaded", [])}
    idle = [v for v in data.get("available", []) if v not in loaded_versions]
    after = Table.grid(padding=(0, 2))
    after.add_row("on disk, not loaded", fmt.listed(idle) or "none")
    after.add_row("policy selects", fmt.listed(data.get("selected_by_policy")) or "none")
    unreleased = data.get("unreleased") or []
    if unreleased:  # why a restart with no routing state would not serve them: only an activation does
        after.add_row("not released", f"{fmt.listed(unreleased)} (served unversioned only once activated)")
    after.add_row("action now", Text(fmt.running(data.get("action")) or "none"))
    last = data.get("last_action")
    after.add_row("last action", fmt.report_line(last, last and traffic_views.report_head(last)))
    if last and last.get("steps"):
        after.add_row("", fmt.steps_text(last["steps"]))
    return fmt.whole(Group(head, facts, *([window] if window is not None else []), loaded, after))


def _problem_or_note(row: JSONObject) -> Text:
    """Why a loaded version does not serve (red), else what to know of it though it serves (yellow)."""
    if row.get("problem"):
        return Text(str(row["problem"]), style="red")
    return Text(str(row.get("note") or ""), style="yellow")


def events_table(data: JSONObject) -> RenderableType:
    table = Table("time", "action", "versions", "result", "failed step / error", "steps", "actor")
    for event in data.get("events", []):
        failure = ": ".join(str(part) for part in (event.get("step"), event.get("error")) if part)
        versions = traffic_views.event_versions(event) or fmt.versions_text(event.get("versions"))
        new = (event.get("detail") or {}).get("new_versions")
        if new:
            versions = f"new on disk: {fmt.listed(new)}"
        table.add_row(
            Text(fmt.when(event.get("time"))),
            Text(str(event.get("action"))),
            Text(versions),
            fmt.result_text(event.get("result")),
            Text(failure, style="red" if event.get("result") == "failed" else ""),
            Text(fmt.steps_text(event.get("steps"))),
            Text(str(event.get("actor") or "")),
        )
    return fmt.whole(table)


def scan_view(data: JSONObject) -> RenderableType:
    lines = Table.grid(padding=(0, 2))
    for name, outcome in (data.get("new_models") or {}).items():
        if outcome.get("problem"):
            lines.add_row("new model", Text(name), Text(f"not served: {outcome['problem']}", style="red"))
        else:
            routed = f"routed to version {fmt.v(outcome.get('stable'))} (loaded: {fmt.listed(outcome.get('loaded'))})"
            lines.add_row("new model", Text(name), Text(routed))
    for name, versions in (data.get("new_versions") or {}).items():
        lines.add_row("new versions", Text(name), Text(f"{fmt.listed(versions)} (served once activated)"))
    for name in data.get("missing_models") or []:
        lines.add_row("missing model", Text(name), Text("gone from the repository; its loaded versions keep serving"))
    if not lines.rows:
        return Text("the repository has not changed since the last scan")
    return fmt.whole(lines)


def report_view(report: JSONObject) -> RenderableType:
    """An action's answer: what happened, each step's duration, and where unversioned requests go now."""
    action, versions, result = report.get("action"), report.get("versions") or {}, report.get("result")
    title = f"{action} {report.get('model')}"
    if result == "unchanged":
        target = fmt.v(versions.get("to", versions.get("version")))
        already = "already loaded" if action == "load" else "already the stable version"
        return Text.assemble((title, "bold"), f": version {target} is {already}: ", fmt.result_text(result))
    facts = Table.grid(padding=(0, 2))
    steps = report.get("steps") or {}
    durations = fmt.durations(steps)
    width = max((len(name) for name, _ in durations), default=0)
    for index, (name, seconds) in enumerate(durations):
        facts.add_row("steps" if index == 0 else "", f"{name:<{width}}  {seconds * 1000:>9.1f} ms")
    marks = [f"{label} {fmt.ms(steps[key])}" for key, label in fmt.MARKERS.items() if key in steps]
    if marks:
        facts.add_row("from request", ", ".join(marks))
    if report.get("flipped_at"):
        facts.add_row("flipped at", fmt.when(report["flipped_at"], precise=True))
    routing = report.get("routing")
    if routing and action in ("activate", "rollback", "traffic", "shadow"):
        facts.add_row(
            "routing",
            f"stable {fmt.v(routing.get('stable'))}, previous {fmt.v(routing.get('previous'))}, "
            f"generation {fmt.v(routing.get('generation'))}",
        )
    comparison = report.get("comparison")
    if comparison:
        diffs = ", ".join(f"{name} {fmt.number(diff)}" for name, diff in (comparison.get("max_abs_diff") or {}).items())
        facts.add_row("max abs diff", Text(f"vs version {fmt.v(comparison.get('against'))}: {diffs or 'no outputs'}"))
    if report.get("drained") is not None:
        left = fmt.v(report.get("in_flight_left"))
        drained = (
            Text(f"yes (in flight left: {left})")
            if report["drained"]
            else Text(f"no: {left} request(s) still in flight when the drain timeout passed", style="yellow")
        )
        facts.add_row("drained", drained)
    for index, (worker, seconds) in enumerate(sorted((report.get("workers") or {}).items())):
        facts.add_row("other workers" if index == 0 else "", _worker_steps(worker, seconds))
    if action in ("activate", "rollback"):  # an unload's report names no versions here: the action is the unload
        facts.add_row("unloaded", fmt.listed(report.get("unloaded")) or "none")
    what = f"version {fmt.versions_text(versions)}"
    if routing and action in ("traffic", "shadow"):  # what it set, then the policy as the gateway keeps it
        what = traffic_views.report_head(report) or what
        show: Literal["canary", "shadow"] = "canary" if action == "traffic" else "shadow"
        traffic_views.policy_rows(facts, routing.get("canary"), routing.get("shadow"), show=show)
    if report.get("error"):
        facts.add_row("warning", Text(str(report["error"]), style="yellow"))
    head = Text.assemble((title, "bold"), f": {what}: ", fmt.result_text(result))
    return fmt.whole(Group(head, facts))


def _worker_steps(worker: str, seconds: Any) -> Text:
    """One other worker's share of an action (``serve --workers N``): its steps, or why it has none."""
    steps = seconds if isinstance(seconds, dict) else {}
    timed = {name: value for name, value in steps.items() if isinstance(value, int | float)}
    if "error" in steps:
        return Text(f"worker {worker}: {steps['error']}", style="yellow")
    text = fmt.steps_text(timed) or str(steps.get("note", "nothing to do"))
    return Text(f"worker {worker}: {text}")
