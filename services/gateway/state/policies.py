"""Traffic policies a routing record can carry: a canary split (with automatic rollback bounds) and a shadow
version. The same parsers read an admin request and a persisted record, so both refuse the same mistakes with
the same words."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from services.gateway.inference_log.records import LogPolicy, Redaction

_HEADER = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")


@dataclass(frozen=True, slots=True)
class RollbackBounds:
    """When the gateway pulls a canary back by itself: its 5xx rate over the window above ``max_error_rate``, or its
    p99 above ``max_p99_ratio`` times the stable version's; judged once the canary has ``min_requests`` in the
    window (the p99 ratio also needs them on the stable side)."""

    max_error_rate: float | None = None
    max_p99_ratio: float | None = None
    window_s: float = 30.0
    min_requests: int = 50

    @classmethod
    def from_json(cls, data: object) -> RollbackBounds:
        fields = _object(data, "rollback", {"max_error_rate", "max_p99_ratio", "window_s", "min_requests"})
        bounds = cls(
            max_error_rate=_number(fields, "max_error_rate", 0.0, 1.0, None, "rollback."),
            max_p99_ratio=_number(fields, "max_p99_ratio", 1.0, 1000.0, None, "rollback."),
            window_s=_number(fields, "window_s", 1.0, 3600.0, 30.0, "rollback.") or 30.0,
            min_requests=int(_number(fields, "min_requests", 1, 1_000_000, 50, "rollback.", integer=True) or 50),
        )
        if bounds.max_error_rate is None and bounds.max_p99_ratio is None:
            raise ValueError("'rollback' needs 'max_error_rate' and/or 'max_p99_ratio'")
        return bounds


@dataclass(frozen=True, slots=True)
class CanaryPolicy:
    """``weight`` percent of unversioned requests go to ``version``; with ``sticky_header`` the split follows that
    header's value (one session, one side). ``rolled_back`` says why the gateway set the weight to 0 by itself."""

    version: int
    weight: float
    sticky_header: str | None = None
    rollback: RollbackBounds | None = None
    promote_after_s: float | None = None
    since: str = ""
    """When this split started (the promotion clock and the rollback window count from here)."""
    rolled_back: str | None = None

    @classmethod
    def from_json(cls, data: object) -> CanaryPolicy:
        fields = _object(
            data,
            "canary",
            {"version", "weight", "sticky_header", "rollback", "promote_after_s", "since", "rolled_back"},
        )
        header = fields.get("sticky_header")
        if header is not None and (not isinstance(header, str) or not _HEADER.match(header)):
            raise ValueError(f"'sticky_header' must be an HTTP header name, got {header!r}")
        since, rolled_back = fields.get("since", ""), fields.get("rolled_back")
        if not isinstance(since, str) or (rolled_back is not None and not isinstance(rolled_back, str)):
            raise ValueError("'since' and 'rolled_back' must be strings")
        return cls(
            version=_version(fields.get("version"), "canary"),
            weight=_number(fields, "weight", 0.0, 100.0, None, "", required=True) or 0.0,
            sticky_header=header.lower() if header else None,
            rollback=RollbackBounds.from_json(fields["rollback"]) if fields.get("rollback") is not None else None,
            promote_after_s=_number(fields, "promote_after_s", 1.0, 30 * 86400.0, None, ""),
            since=since,
            rolled_back=rolled_back,
        )


@dataclass(frozen=True, slots=True)
class ShadowPolicy:
    """A ``sample`` fraction of unversioned requests also runs on ``version``; its answers are compared, never sent.
    The state keeps the fraction; the admin API, the CLI and the console speak percent (``percent``), as the
    canary's ``weight`` does."""

    version: int
    sample: float

    @classmethod
    def from_json(cls, data: object) -> ShadowPolicy:
        fields = _object(data, "shadow", {"version", "sample"})
        sample = _number(fields, "sample", 0.0, 1.0, None, "", required=True)
        return cls(_version(fields.get("version"), "shadow"), sample or 0.0)

    @classmethod
    def from_request(cls, data: object) -> tuple[ShadowPolicy, str | None]:
        """The policy an admin request asks for: ``{"version": v, "percent": 0-100}``, or the deprecated
        ``"sample"`` fraction, with the note that says so (``None`` when ``percent`` was given)."""
        fields = _object(data, "shadow", {"version", "percent", "sample"})
        if "percent" in fields and "sample" in fields:
            raise ValueError("give 'percent' (0-100), not both 'percent' and the deprecated 'sample'")
        if "sample" in fields:
            return cls.from_json(fields), DEPRECATED_SAMPLE
        percent = _number(fields, "percent", 0.0, 100.0, None, "", required=True)
        return cls(_version(fields.get("version"), "shadow"), (percent or 0.0) / 100), None

    @property
    def percent(self) -> float:
        return round(self.sample * 100, 6)


@dataclass(frozen=True)
class InferenceLogPolicy(LogPolicy):
    """A model's own inference-log policy, kept in its routing record so that every replica logs alike: the share of
    its requests logged (``sample``, a fraction; ``None``: ``SWITCHYARD_INFERENCE_LOG_SAMPLE``) and the inputs never
    logged as sent (``redact``: input name -> ``drop`` or ``hash``). The admin API speaks percent, as for a canary."""

    def to_json(self) -> dict[str, Any]:
        return {"sample": self.sample, "redact": dict(self.redact)}

    @classmethod
    def from_json(cls, data: object) -> InferenceLogPolicy:
        fields = _object(data, "inference_log", {"sample", "redact"})
        return cls(_number(fields, "sample", 0.0, 1.0, None, ""), _redactions(fields.get("redact")))

    @classmethod
    def from_request(cls, data: object) -> InferenceLogPolicy:
        """``{"percent": 0-100 or null, "redact": {"input": "drop" | "hash"}}`` (both optional)."""
        fields = _object(data, "inference_log", {"percent", "redact"})
        percent = _number(fields, "percent", 0.0, 100.0, None, "")
        return cls(None if percent is None else percent / 100, _redactions(fields.get("redact")))

    @property
    def percent(self) -> float | None:
        return None if self.sample is None else round(self.sample * 100, 6)


REDACTIONS = ("drop", "hash")


def _redactions(value: object) -> dict[str, Redaction]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and v in REDACTIONS for k, v in value.items()):
        raise ValueError(f"'redact' must map input names to {' or '.join(map(repr, REDACTIONS))}, got {value!r}")
    return {name: "drop" if how == "drop" else "hash" for name, how in value.items()}


DEPRECATED_SAMPLE = ("'sample' (a fraction, 0-1) is deprecated: give 'percent' (0-100), the unit of the canary's "
                     "'weight'")


def _object(data: object, what: str, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValueError(f"'{what}' must be a JSON object")
    unknown = sorted(set(data) - allowed)
    if unknown:
        names = ", ".join(repr(k) for k in unknown)
        raise ValueError(f"unknown field(s) {names} in '{what}'; expected: {', '.join(sorted(allowed))}")
    return data


def _version(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"the {what} version must be a non-negative integer, got {value!r}")
    return value


def _number(
    fields: dict[str, Any],
    key: str,
    low: float,
    high: float,
    default: float | None,
    prefix: str,
    *,
    integer: bool = False,
    required: bool = False,
) -> float | None:
    value = fields.get(key)
    if value is None:
        if required:
            raise ValueError(f"'{prefix}{key}' is required")
        return default
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) or not low <= value <= high:
        kind = "an integer" if integer else "a number"
        raise ValueError(f"'{prefix}{key}' must be {kind} from {low:g} to {high:g}, got {value!r}")
    return float(value)
