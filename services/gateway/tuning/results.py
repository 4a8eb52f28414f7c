"""What a run measured: one ``Measurement`` per concurrency level, one ``Trial`` per loaded candidate, and the
reading of them: which trials meet the SLO, the Pareto front (throughput vs p99), the winner."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from services.gateway.tuning.candidates import Candidate


@dataclass(frozen=True)
class Measurement:
    concurrency: int
    requests: int
    errors: int
    seconds: float
    p50_ms: float
    p99_ms: float
    cpu_ms_per_request: float
    """Server CPU per answered request: the gateway process (which also runs the tuner's clients) plus, for a
    Triton on this host, the Triton process group."""
    error: str | None = None
    """The first failed request's error, when any failed (``errors`` counts them)."""

    @property
    def throughput(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "errors": self.errors,
            "seconds": round(self.seconds, 4),
            "throughput": round(self.throughput, 1),
            "p50_ms": finite_ms(self.p50_ms, 3),
            "p99_ms": finite_ms(self.p99_ms, 3),
            "cpu_ms_per_request": round(self.cpu_ms_per_request, 4),
            "error": self.error,
        }

    @classmethod
    def from_json(cls, fields: dict[str, Any]) -> Measurement:
        return cls(
            int(fields["concurrency"]),
            int(fields["requests"]),
            int(fields["errors"]),
            float(fields["seconds"]),
            _unanswered(fields["p50_ms"]),
            _unanswered(fields["p99_ms"]),
            float(fields["cpu_ms_per_request"]),
            fields.get("error"),
        )


@dataclass(frozen=True)
class Trial:
    number: int
    round: int
    """0: screened at the highest concurrency only; 1: measured at every requested concurrency; 2: a finalist
    measured again at the highest concurrency, so that the winner is not picked on one noisy sample."""
    candidate: Candidate
    default: bool
    """The settings the model's config.pbtxt has now."""
    measurements: tuple[Measurement, ...]
    error: str | None = None
    """Why the trial has no figures (its config did not load, the budget ran out mid-way)."""

    def meets(self, p99_ms: float, levels: Sequence[int]) -> bool:
        """Measured at every level in ``levels``, without errors, each p99 at or under the SLO."""
        by_level = {m.concurrency: m for m in self.measurements}
        return self.error is None and all(
            level in by_level and by_level[level].errors == 0 and by_level[level].p99_ms <= p99_ms
            for level in levels
        )

    @property
    def worst_p99_ms(self) -> float:
        return max((m.p99_ms for m in self.measurements), default=float("inf"))

    @property
    def top(self) -> Measurement | None:
        """The measurement at the highest concurrency this trial ran."""
        return max(self.measurements, key=lambda m: m.concurrency, default=None)

    @property
    def throughput(self) -> float:
        top = self.top
        return top.throughput if top is not None else 0.0


    def to_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "round": self.round,
            "candidate": self.candidate.to_json(),
            "label": self.candidate.label,
            "default": self.default,
            "measurements": [m.to_json() for m in self.measurements],
            "error": self.error,
        }

    @classmethod
    def from_json(cls, fields: dict[str, Any]) -> Trial:
        return cls(
            int(fields["number"]),
            int(fields["round"]),
            Candidate.from_json(fields["candidate"]),
            bool(fields["default"]),
            tuple(Measurement.from_json(m) for m in fields["measurements"]),
            fields.get("error"),
        )


def qualifies(trials: Sequence[Trial], candidate: Candidate, p99_ms: float, levels: Sequence[int]) -> bool:
    """Measured at every level, and every measurement of it (each run at every level, each confirmation at the
    highest) met the SLO without errors."""
    runs = [t for t in trials if t.candidate == candidate and t.round >= 1]
    full = [t for t in runs if t.round == 1]
    return bool(full) and all(t.meets(p99_ms, levels if t.round == 1 else levels[-1:]) for t in runs)


def score(trials: Sequence[Trial], candidate: Candidate, top_level: int) -> float:
    """The candidate's throughput at the highest level, averaged over every run of it that measured that level."""
    seen = [m.throughput for t in trials if t.candidate == candidate and t.round >= 1 and t.error is None
            for m in t.measurements if m.concurrency == top_level]
    return sum(seen) / len(seen) if seen else 0.0


def worst_p99_ms(trials: Sequence[Trial], candidate: Candidate) -> float:
    """The candidate's highest p99 over every level of every run (screening aside): how its SLO is judged."""
    return max((t.worst_p99_ms for t in trials if t.candidate == candidate and t.round >= 1), default=float("inf"))


def contenders(trials: Sequence[Trial]) -> list[Candidate]:
    """Who may win: the finalists, once any was measured again (round 2); before that, or in a run without
    confirmations (``--candidate``, a budget too small for them), every candidate measured at every level.

    A candidate measured once is never ranked against finalists measured twice: its one lucky run would weigh as
    much as their two, and a confirmation that came out lower would crown it. Among the finalists the comparison
    is even, each with one full run and one confirmation."""
    confirmed = [t.candidate for t in trials if t.round == 2]
    measured = confirmed or [t.candidate for t in trials if t.round == 1 and t.error is None]
    return list(dict.fromkeys(measured))


def winner(trials: Sequence[Trial], p99_ms: float, levels: Sequence[int]) -> Trial | None:
    """Among the contenders meeting the SLO at every level in every run, the highest throughput at the highest
    level (averaged over its runs), then the lowest worst p99; its first full run stands for it."""
    meeting = [c for c in contenders(trials) if qualifies(trials, c, p99_ms, levels)]
    best = max(meeting, key=lambda c: (score(trials, c, levels[-1]), -worst_p99_ms(trials, c)), default=None)
    return next((t for t in trials if t.candidate == best and t.round == 1 and t.error is None), None)


def pareto_front(trials: Sequence[Trial]) -> list[Trial]:
    """Trials no other trial beats on both throughput (higher) and p99 (lower) at the highest level, by p99."""
    measured = [t for t in trials if t.error is None and t.top is not None and t.top.errors == 0]
    top_level = max((t.top.concurrency for t in measured if t.top is not None), default=0)
    measured = [t for t in measured if t.top is not None and t.top.concurrency == top_level]
    front = []
    for trial in measured:
        assert trial.top is not None
        dominated = any(
            other.top is not None
            and other.top.throughput >= trial.top.throughput
            and other.top.p99_ms <= trial.top.p99_ms
            and (other.top.throughput > trial.top.throughput or other.top.p99_ms < trial.top.p99_ms)
            for other in measured
        )
        if not dominated:
            front.append(trial)
    return sorted(front, key=lambda t: t.top.p99_ms if t.top is not None else 0.0)


def closest(trials: Sequence[Trial]) -> Trial | None:
    """The trial with the lowest worst-level p99 (what an unmeetable SLO's error names): among the trials measured
    at every level when there are any, since a screened trial ran the highest level only."""
    measured = [t for t in trials if t.error is None and t.measurements]
    full = [t for t in measured if t.round == 1]
    return min(full or measured, key=lambda t: t.worst_p99_ms, default=None)


def best_p99_ms(trials: Sequence[Trial]) -> float | None:
    found = closest(trials)
    return finite_ms(found.worst_p99_ms, 3) if found is not None else None


def finite_ms(value: float, digits: int) -> float | None:
    """A latency for JSON: ``None`` where no request was answered (JSON has no infinity: ``json.dumps`` would write
    ``Infinity``, which strict parsers refuse, and the admin API's encoder writes null anyway)."""
    return round(value, digits) if math.isfinite(value) else None


def _unanswered(value: float | None) -> float:
    return float("inf") if value is None else float(value)
