"""What a tuning run is asked to do: the SLO, the load levels, the time it may take, and whether it may publish.
Bounded by the server, whatever the client asks (STYLE 18)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.gateway.tuning.candidates import Candidate

MAX_CONCURRENCY = 256
MAX_CANDIDATES = 16
MAX_LEVELS = 6
MAX_DURATION_S = 60.0
MAX_BUDGET_S = 3600.0
MIN_BUDGET_S = 5.0
DEFAULT_CONCURRENCY = (1, 8, 32)
DEFAULT_DURATION_S = 2.0
DEFAULT_BUDGET_S = 120.0


class TuneOptionsError(ValueError):
    """An option out of its range; the message names it and the range."""


@dataclass(frozen=True)
class TuneOptions:
    p99_ms: float
    """The SLO: every requested concurrency must keep its p99 latency at or under this."""
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    """Closed-loop clients per measurement, ascending; the winner's throughput is read at the highest."""
    duration_s: float = DEFAULT_DURATION_S
    """Measured seconds per concurrency level in the final round (the first round measures half as long)."""
    budget_s: float = DEFAULT_BUDGET_S
    """Wall-clock limit of the whole run; no trial starts that would not end within it."""
    version: int | None = None
    """The version to tune; ``None``: the one serving now."""
    write: bool = False
    """Publish the winner as the model's ``config.pbtxt`` (the old one kept as ``config.pbtxt.bak-<time>``)."""
    in_place: bool = False
    """Load each trial config on the serving model itself instead of beside it (Triton only): it changes what
    production traffic runs on while the run lasts."""
    candidates: tuple[Candidate, ...] = ()
    """Measure exactly these, in this order, at every concurrency (no curve, no search): a re-check of settings a
    run found, in a run of its own. A candidate may repeat (``A B B A`` spreads drift over both)."""

    def __post_init__(self) -> None:
        if not 0 < self.p99_ms <= 60_000:
            raise TuneOptionsError(f"p99_ms must be above 0 and at most 60000, got {self.p99_ms:g}")
        levels = self.concurrency
        if not levels or len(levels) > MAX_LEVELS or any(not 1 <= c <= MAX_CONCURRENCY for c in levels):
            raise TuneOptionsError(
                f"concurrency takes 1 to {MAX_LEVELS} levels, each from 1 to {MAX_CONCURRENCY}, got {list(levels)}"
            )
        if list(levels) != sorted(set(levels)):
            raise TuneOptionsError(f"concurrency levels must be distinct and ascending, got {list(levels)}")
        if not 0.2 <= self.duration_s <= MAX_DURATION_S:
            raise TuneOptionsError(f"duration_s must be from 0.2 to {MAX_DURATION_S:g}, got {self.duration_s:g}")
        if not MIN_BUDGET_S <= self.budget_s <= MAX_BUDGET_S:
            raise TuneOptionsError(f"budget_s must be from {MIN_BUDGET_S:g} to {MAX_BUDGET_S:g}, got {self.budget_s:g}")
        if len(self.candidates) > MAX_CANDIDATES:
            raise TuneOptionsError(f"at most {MAX_CANDIDATES} candidates, got {len(self.candidates)}")
        if self.version is not None and self.version < 0:
            raise TuneOptionsError(f"version must be a non-negative integer, got {self.version}")

    @classmethod
    def from_json(cls, fields: dict[str, Any]) -> TuneOptions:
        """The admin API's request body; unknown keys and wrong types are refused by name."""
        kinds: dict[str, tuple[type, ...]] = {
            "p99_ms": (int, float),
            "concurrency": (list,),
            "duration_s": (int, float),
            "budget_s": (int, float),
            "version": (int, type(None)),
            "write": (bool,),
            "in_place": (bool,),
            "candidates": (list,),
        }
        for key, value in fields.items():
            kind = kinds.get(key)
            if kind is None:
                raise TuneOptionsError(f"unknown option {key!r}; expected: {', '.join(kinds)}")
            numeric = kind != (bool,)
            if not isinstance(value, kind) or (numeric and isinstance(value, bool)):
                raise TuneOptionsError(f"option {key!r} has the wrong type: {value!r}")
        if "p99_ms" not in fields:
            raise TuneOptionsError("option 'p99_ms' (the latency SLO in milliseconds) is required")
        levels = fields.get("concurrency", list(DEFAULT_CONCURRENCY))
        if any(not isinstance(c, int) or isinstance(c, bool) for c in levels):
            raise TuneOptionsError(f"concurrency must be a list of integers, got {levels!r}")
        try:
            candidates = tuple(Candidate.parse(str(label)) for label in fields.get("candidates", []))
        except ValueError as exc:
            raise TuneOptionsError(str(exc)) from None
        return cls(
            candidates=candidates,
            p99_ms=float(fields["p99_ms"]),
            concurrency=tuple(levels),
            duration_s=float(fields.get("duration_s", DEFAULT_DURATION_S)),
            budget_s=float(fields.get("budget_s", DEFAULT_BUDGET_S)),
            version=fields.get("version"),
            write=bool(fields.get("write", False)),
            in_place=bool(fields.get("in_place", False)),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "p99_ms": self.p99_ms,
            "concurrency": list(self.concurrency),
            "duration_s": self.duration_s,
            "budget_s": self.budget_s,
            "version": self.version,
            "write": self.write,
            "in_place": self.in_place,
            "candidates": [c.label for c in self.candidates],
        }
