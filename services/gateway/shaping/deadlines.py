"""A request's deadline and priority from whichever places the client may name them: the v2 ``timeout`` and
``priority`` parameters, the ``X-Request-Timeout`` / ``X-Priority`` headers, the gRPC call's own deadline."""

from __future__ import annotations

import re
from dataclasses import dataclass

from services.gateway.errors import InvalidInput

_MILLIS = re.compile(r"[0-9]{1,12}(\.[0-9]{1,6})?")
_LEVEL = re.compile(r"[0-9]{1,4}")


@dataclass(frozen=True, slots=True)
class Deadlines:
    default_s: float | None
    """Budget of a request that names none; ``None``: no deadline."""
    max_s: float | None
    """Longest budget a request may ask for; longer ones are cut to it."""

    def budget(self, timeout_s: float | None, header_ms: str | None, call_remaining_s: float | None) -> float | None:
        """Seconds the request may take in all: the shortest it names anywhere, cut to the maximum."""
        if timeout_s is None and header_ms is None and call_remaining_s is None:
            budget = self.default_s  # nearly every request: nothing to compare
        else:
            asked = [t for t in (timeout_s, _header_seconds(header_ms), call_remaining_s) if t is not None]
            budget = min(asked) if asked else self.default_s
        if budget is not None and self.max_s is not None:
            budget = min(budget, self.max_s)
        return budget


def _header_seconds(value: str | None) -> float | None:
    if value is None:
        return None
    text = value.strip()
    if not _MILLIS.fullmatch(text) or float(text) <= 0:
        raise InvalidInput(
            "X-Request-Timeout must be a positive number of milliseconds like 250 or 2.5 (at most 12 digits, and 6 "
            f"after the point: a microsecond), got {_shown(value)}"
        )
    return float(text) / 1e3


@dataclass(frozen=True, slots=True)
class Priorities:
    levels: int
    """Ranks a request may name: 1 (highest) .. ``levels`` (lowest)."""
    default: int
    """Rank of a request that names none (or names 0, Triton's "the default")."""

    def rank(self, parameter: int, header: str | None) -> int:
        """The ``priority`` parameter wins over the ``X-Priority`` header; 0 and absent mean the default."""
        level = parameter
        if not level and header is not None:
            text = header.strip()
            if not _LEVEL.fullmatch(text):
                raise InvalidInput(
                    f"X-Priority must be an integer from 1 (highest) to {self.levels}, got {_shown(header)}"
                )
            level = int(text)
        if not level:
            return self.default
        if level > self.levels:
            raise InvalidInput(
                f"priority {level} is out of range: use 1 (highest) to {self.levels} (lowest), or 0 for the default"
            )
        return level


def _shown(value: str) -> str:
    """A client's value quoted for an error message, trimmed so that a huge header cannot bloat the answer."""
    return repr(value if len(value) <= 40 else value[:40] + "…")
