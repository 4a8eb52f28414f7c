"""How ``switchyard models`` shows a model's traffic policies: the canary split (its bounds, its promotion, why the
gateway pulled it back) with the live window figures of both sides, and the shadow version."""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from rich.table import Table
from rich.text import Text

from services.ops import format as fmt
from services.ops.client import JSONObject

__all__ = ["compact", "event_versions", "policy_rows", "report_head", "window_table"]


def compact(canary: JSONObject | None, shadow: JSONObject | None) -> str:
    """One cell of ``models list``: ``canary 2 @ 20%, shadow 3 @ 50%``."""
    parts = []
    if canary:
        if canary.get("rolled_back") and not canary.get("weight"):
            parts.append(f"canary {fmt.v(canary.get('version'))} pulled back")
        else:
            parts.append(f"canary {fmt.v(canary.get('version'))} @ {_weight(canary.get('weight'))}")
    if shadow:
        parts.append(f"shadow {fmt.v(shadow.get('version'))} @ {_shadow_share(shadow)}")
    return ", ".join(parts)


def report_head(report: JSONObject) -> str | None:
    """What a ``traffic`` or ``shadow`` action set: ``canary 2 @ 20%``, ``shadow cleared``; None for other actions."""
    return _set(report.get("action"), report.get("routing"))


def event_versions(event: JSONObject) -> str | None:
    """The versions cell of a traffic event in the audit log; None for other events."""
    detail = event.get("detail") or {}
    if event.get("action") == "canary_rollback":
        return f"canary pulled back: {detail.get('bound')}"
    return _set(event.get("action"), detail)


def _set(action: Any, policies: Any) -> str | None:
    if action not in ("traffic", "shadow") or not isinstance(policies, dict):
        return None
    which = "canary" if action == "traffic" else "shadow"
    policy = policies.get(which)
    if not policy:
        return f"{which} cleared"
    return compact(policy, None) if which == "canary" else compact(None, policy)


def policy_rows(
    grid: Table,
    canary: JSONObject | None,
    shadow: JSONObject | None,
    *,
    show: Literal["canary", "shadow", "both"] = "both",
) -> None:
    """The ``canary``, ``rollback``, ``promotion`` and ``shadow`` rows of a facts grid (``show``: ``canary``,
    ``shadow`` or ``both``)."""
    if show in ("canary", "both"):
        _canary_rows(grid, canary)
    if show in ("shadow", "both"):
        if shadow:
            grid.add_row(
                "shadow",
                f"version {fmt.v(shadow.get('version'))} on {_shadow_share(shadow)} of unversioned "
                "requests (its answers are compared, never sent)",
            )
        else:
            grid.add_row("shadow", "none")


def window_table(canary: JSONObject | None, stable: Any) -> Table | None:
    """Both sides of the split over the canary's window, as the gateway judges them."""
    window = (canary or {}).get("window")
    if not canary or not isinstance(window, dict):
        return None
    title = f"live window: the last {_seconds(window.get('seconds'))}"
    table = Table("side", "version", "requests", "5xx", "5xx rate", "p99 ms", title=title, title_justify="left")
    for side, version in (("stable", stable), ("canary", canary.get("version"))):
        figures = window.get(side) or {}
        p99 = figures.get("p99_ms")
        table.add_row(
            side,
            fmt.v(version),
            fmt.v(figures.get("requests")),
            fmt.v(figures.get("errors")),
            fmt.percent(figures.get("error_rate") or 0),
            "–" if p99 is None else f"{float(p99):.1f}",
        )
    return fmt.whole(table)


def _canary_rows(grid: Table, canary: JSONObject | None) -> None:
    if not canary:
        grid.add_row("canary", "none")
        return
    sticky = canary.get("sticky_header")
    split = f"version {fmt.v(canary.get('version'))} at {_weight(canary.get('weight'))} of unversioned requests"
    split += f", sticky by header {sticky}" if sticky else ", request by request"
    if canary.get("since"):
        split += f", since {fmt.when(canary['since'])}"
    grid.add_row("canary", split)
    if canary.get("rolled_back"):
        grid.add_row("", Text(f"pulled back: {canary['rolled_back']}", style="red"))
    grid.add_row("rollback", _bounds(canary.get("rollback")))
    after = canary.get("promote_after_s")
    if after is None:
        grid.add_row("promotion", "none: activate the canary to make it stable")
    elif canary.get("rolled_back"):
        grid.add_row("promotion", f"after {_seconds(after)} without a broken bound (off: pulled back)")
    else:
        grid.add_row("promotion", f"after {_seconds(after)} without a broken bound{_at(canary.get('since'), after)}")


def _bounds(rollback: Any) -> str:
    if not isinstance(rollback, dict):
        return "none: the gateway never pulls this canary back by itself"
    broken = []
    if rollback.get("max_error_rate") is not None:
        broken.append(f"its 5xx rate > {fmt.percent(rollback['max_error_rate'])}")
    if rollback.get("max_p99_ratio") is not None:
        broken.append(f"its p99 > {fmt.number(float(rollback['max_p99_ratio']))}× the stable version's")
    return (
        f"when {' or '.join(broken)} over the last {_seconds(rollback.get('window_s'))} "
        f"(judged once the canary has {fmt.v(rollback.get('min_requests'))} requests in it)"
    )


def _seconds(value: Any) -> str:
    seconds = float(value or 0)
    return f"{int(seconds)} s" if seconds.is_integer() else f"{seconds:g} s"


def _weight(weight: Any) -> str:
    return f"{float(weight or 0):g}%"


def _at(since: Any, after_s: Any) -> str:
    try:
        start = dt.datetime.fromisoformat(str(since))
    except ValueError:
        return ""
    return f" (at {fmt.when((start + dt.timedelta(seconds=float(after_s))).isoformat())})"


def _shadow_share(shadow: dict[str, Any]) -> str:
    """The shadow's share in percent; a gateway from before ``percent`` gives only the ``sample`` fraction."""
    if shadow.get("percent") is not None:
        return f"{float(shadow['percent']):.3g}%"
    return fmt.percent(shadow.get("sample") or 0)
