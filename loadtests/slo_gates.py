"""SLO gates evaluated when locust quits: the error ratio over every request, and the p99 of named stats entries.
They decide the exit code (1 when a gate fails, else 0, whatever ``--exit-code-on-error`` says), and each gate
logs its measured figure against the allowed one; a failed gate names the first failure that explains it."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from load_options import LoadOptions
from locust.env import Environment
from locust.runners import WorkerRunner
from locust.stats import RequestStats, StatsEntry, StatsError

log = logging.getLogger(__name__)
ALL = "all"
"""The p99 gate's name for every request together (locust's Aggregated row)."""


def evaluate(
    stats: RequestStats,
    max_error_ratio: float | None,
    p99_ms: dict[str, float],
    calls_before: Mapping[str, Sequence[str]] | None = None,
) -> tuple[list[str], list[str]]:
    """(breaches, passes): one line per gate. ``calls_before`` maps an entry to those its user calls first (and
    without which it never runs): a gate with no requests names their first failure."""
    calls_before = calls_before or {}
    breaches: list[str] = []
    passes: list[str] = []
    total = stats.total
    if max_error_ratio is not None:
        line = (
            f"error ratio {total.fail_ratio:.4g} ({total.num_failures} of {total.num_requests} requests failed), "
            f"allowed {max_error_ratio:g}"
        )
        if total.fail_ratio > max_error_ratio:
            first = _first_failure(stats.errors.values())
            breaches.append(line if first is None else f"{line}; the first failure: {_describe(first)}")
        else:
            passes.append(line)
    for name, bound in p99_ms.items():
        entry = _entry(stats, name)
        if entry is None or entry.num_requests == 0:
            breaches.append(f"p99 of {name!r}: no requests recorded — {_why_none(stats, name, calls_before)}")
            continue
        p99 = entry.get_response_time_percentile(0.99)
        line = f"p99 of {name!r} {p99:g} ms over {entry.num_requests} requests, allowed {bound:g} ms"
        (breaches if p99 > bound else passes).append(line)
    return breaches, passes


def enforce(
    environment: Environment, calls_before: Mapping[str, Sequence[str]] | None = None, **_kwargs: Any
) -> None:
    """Listener of ``quitting`` (``calls_before``: see ``evaluate``). A worker leaves the verdict to its master, which
    holds every worker's stats."""
    if environment.parsed_options is None or isinstance(environment.runner, WorkerRunner):
        return
    options = LoadOptions.of(environment)
    breaches, passes = evaluate(environment.stats, options.max_error_ratio, options.p99_ms, calls_before)
    runner = environment.runner
    if runner is not None and runner.exceptions:
        # An exception in the users' own code is no request failure, yet the run did not do what it should.
        count = sum(e["count"] for e in runner.exceptions.values())
        breaches.append(f"{count} unexpected exceptions in the load test's users (see the exceptions report)")
    if options.max_error_ratio is None and not options.p99_ms and not breaches:
        return  # no gate configured: locust's own rule (--exit-code-on-error) decides
    for line in passes:
        log.info("SLO gate passed: %s", line)
    for line in breaches:
        log.error("SLO gate failed: %s", line)
    environment.process_exit_code = 1 if breaches else 0


def _why_none(stats: RequestStats, name: str, calls_before: Mapping[str, Sequence[str]]) -> str:
    names = {name, *calls_before.get(name, ())}
    first = _first_failure(error for error in stats.errors.values() if error.name in names)
    if first is not None:
        return f"every call failed: {_describe(first)}"
    known = sorted({n for n, _ in stats.entries})
    # Locust splits the users by weight (the ops user first, then HTTP 2 : gRPC 1): with few users a kind may get none.
    return (f"no entry of that name (entries: {', '.join(known) or 'none'}); if no user of the kind that sends it ran, "
            "raise the user count (--users, USERS=4 or more runs every kind)")


def _first_failure(errors: Iterable[StatsError]) -> StatsError | None:
    """The failure seen first (locust's first_seen; a worker's errors keep theirs through the master)."""
    return min(errors, key=lambda error: error.first_seen or 0.0, default=None)


def _describe(error: StatsError) -> str:
    # Standalone, locust keeps the exception object; from workers it gets repr() strings.
    text = error.error if isinstance(error.error, str) else str(error.error)
    return f"{error.name!r} ({error.method}): {text} ({error.occurrences}x)"


def _entry(stats: RequestStats, name: str) -> StatsEntry | None:
    """The stats under ``name`` (every request type that used it, merged), or ``all`` for the total."""
    if name == ALL:
        return stats.total
    found = [entry for (entry_name, _), entry in stats.entries.items() if entry_name == name]
    if len(found) <= 1:
        return found[0] if found else None
    merged = StatsEntry(stats, name, "", use_response_times_cache=False)
    for entry in found:
        merged.extend(entry)
    return merged
