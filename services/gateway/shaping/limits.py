"""Rate-limit rules: which token bucket a request draws from and its size, from settings and a TOML file.

The file (``SWITCHYARD_LIMITS_FILE``; every table and key is optional)::

    [default]                          # overrides SWITCHYARD_RATE_LIMIT_RPS / _BURST, key by key
    rps = 100                          # sustained requests per second; 0: unlimited
    burst = 200                        # bucket size (>= 1); left out: one second's worth, ceil(rps)
    [tenants.acme]                     # a tenant (the name from the keys file)
    rps = 500
    burst = 1000
    [models.classifier]                # a model, for every tenant: each tenant gets its own bucket
    rps = 20
    [tenants.acme.models.classifier]   # one tenant on one model
    rps = 100

Each request draws from ONE bucket, chosen by the most specific rule: tenant + model, then model, then the API key's
own ``rps`` (the keys file), then tenant, then default. A model rule (of either kind) gives a bucket per (tenant,
model) that replaces the tenant's bucket for that model, so calls to it do not count against the tenant's other
traffic. ``rps = 0`` makes a rule unlimited (e.g. an
internal tenant). Bucket keys are built only from configured names: a model without a rule shares its tenant's
bucket, so a client cannot create buckets by inventing model names; tenants must come from ``ApiKeys``.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_RULE_KEYS = frozenset({"rps", "burst"})


class LimitsError(ValueError):
    """The rate-limit settings or file are not valid: the gateway does not start."""


@dataclass(frozen=True)
class Limit:
    rps: float
    """Tokens added per second; 0: unlimited."""
    burst: int
    """Bucket size: requests that may arrive at once."""

    def __post_init__(self) -> None:
        if not math.isfinite(self.rps) or self.rps < 0:
            raise LimitsError(f"rps must be a finite number >= 0, got {self.rps}")
        if self.burst < 1:
            raise LimitsError(f"burst must be >= 1, got {self.burst}")

    @classmethod
    def of(cls, rps: float, burst: int | None) -> Limit:
        """``burst`` None or 0: one second's worth (``ceil(rps)``, at least 1), as the settings document."""
        if not math.isfinite(rps) or rps < 0:  # before ceil(), which fails on inf and nan
            raise LimitsError(f"rps must be a finite number >= 0, got {rps}")
        return cls(rps, burst or max(1, math.ceil(rps)))


KeyLimit = tuple[str, Limit]
"""An API key's own limit: (its id, its limit)."""


def scope_of(bucket: str) -> str:
    """Who a bucket key belongs to, for messages: ``tenant 'acme'``, ``tenant 'acme' on model 'classifier'`` or
    ``API key 'team-a'``."""
    kind, _, rest = bucket.partition(":")
    if kind == "key":
        return f"API key '{rest}'"
    tenant, _, model = rest.partition(":")  # tenant names have no ':' (see keys.py); model names may
    return f"tenant '{tenant}' on model '{model}'" if kind == "model" else f"tenant '{rest}'"


class LimitTable:
    """The rules, resolved in O(1) per request."""

    def __init__(self, rps: float, burst: int = 0, path: Path | None = None) -> None:
        if burst < 0:
            raise LimitsError(f"SWITCHYARD_RATE_LIMIT_BURST must be >= 0, got {burst}")
        try:
            default = Limit.of(rps, burst)
        except LimitsError as exc:
            raise LimitsError(f"SWITCHYARD_RATE_LIMIT_RPS: {exc}") from None
        self._tenants: dict[str, Limit] = {}
        self._models: dict[str, Limit] = {}
        self._pairs: dict[tuple[str, str], Limit] = {}
        if path is not None:
            default = self._read(path, rps, burst, default)
        self._default = default

    @property
    def limited(self) -> bool:
        """False when no rule limits anything: the gateway then needs no rate limiter at all."""
        rules = [self._default, *self._tenants.values(), *self._models.values(), *self._pairs.values()]
        return any(rule.rps > 0 for rule in rules)

    def lookup(self, tenant: str, model: str, own: KeyLimit | None = None) -> tuple[str, Limit] | None:
        """The bucket key and its limit for a request, or None when it is unlimited. ``own``: the API key's own
        limit (the keys file's ``rps``), which takes the place of its tenant's rules but not of a model's."""
        rule = self._pairs.get((tenant, model))
        if rule is None:
            rule = self._models.get(model)
        if rule is not None:
            key = f"model:{tenant}:{model}"
        elif own is not None:
            key, rule = f"key:{own[0]}", own[1]
        else:
            rule = self._tenants.get(tenant, self._default)
            key = f"tenant:{tenant}"
        return None if rule.rps == 0 else (key, rule)

    def _read(self, path: Path, rps: float, burst: int, default: Limit) -> Limit:
        try:
            with path.open("rb") as file:
                data = tomllib.load(file)
        except OSError as exc:
            raise LimitsError(f"the limits file {path} cannot be read: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise LimitsError(f"the limits file {path} is not valid TOML: {exc}") from None
        _only(data, {"default", "tenants", "models"}, f"{path}: top level")
        if "default" in data:
            table = _table(data["default"], f"{path}: [default]")
            _only(table, _RULE_KEYS, f"{path}: [default]")
            default = _rule({"rps": rps, "burst": burst or None, **table}, f"{path}: [default]")
        for model, table in _table(data.get("models", {}), f"{path}: [models]").items():
            self._models[model] = _checked_rule(table, f"{path}: [models.{model}]")
        for tenant, raw in _table(data.get("tenants", {}), f"{path}: [tenants]").items():
            where = f"{path}: [tenants.{tenant}]"
            table = _table(raw, where)
            _only(table, _RULE_KEYS | {"models"}, where)
            if "burst" in table and "rps" not in table:
                raise LimitsError(f"{where}: 'burst' needs an 'rps' beside it")
            if "rps" in table:
                self._tenants[tenant] = _rule(table, where)
            models = _table(table.get("models", {}), f"{path}: [tenants.{tenant}.models]")
            for model, rule in models.items():
                self._pairs[tenant, model] = _checked_rule(rule, f"{path}: [tenants.{tenant}.models.{model}]")
        return default


def _table(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise LimitsError(f"{where} must be a table, got {type(value).__name__} {value!r}")
    return value


def _only(table: Mapping[str, Any], allowed: frozenset[str] | set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise LimitsError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")


def _checked_rule(value: Any, where: str) -> Limit:
    """A model rule: its own table, with ``rps`` required."""
    table = _table(value, where)
    _only(table, _RULE_KEYS, where)
    if "rps" not in table:
        raise LimitsError(f"{where}: 'rps' is missing")
    return _rule(table, where)


def _rule(table: Mapping[str, Any], where: str) -> Limit:
    rps, burst = table["rps"], table.get("burst")
    # bool is an int to Python: `rps = true` is a mistake, not 1 request per second.
    if isinstance(rps, bool) or not isinstance(rps, int | float):
        raise LimitsError(f"{where}: 'rps' must be a number, got {rps!r}")
    if burst is not None and (isinstance(burst, bool) or not isinstance(burst, int)):
        raise LimitsError(f"{where}: 'burst' must be a whole number, got {burst!r}")
    if burst is not None and burst < 1:
        raise LimitsError(f"{where}: 'burst' must be >= 1, got {burst}")
    try:
        return Limit.of(float(rps), burst)
    except LimitsError as exc:
        raise LimitsError(f"{where}: {exc}") from None
