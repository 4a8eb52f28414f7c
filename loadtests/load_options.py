"""The load test's own options (locust custom arguments, each also read from an environment variable), parsed once
into a frozen dataclass that the users and the SLO gates read."""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass
from typing import Any

from grpc_target import GrpcTarget, resolve
from kserve_tensors import parse_dims
from locust.env import Environment

log = logging.getLogger(__name__)
# Asked of the gateway once per host: at start-up (check_options), then every user and the gates read the answer.
_grpc_target = functools.cache(resolve)


def add_arguments(parser: Any) -> None:
    """Listener of ``init_command_line_parser``. ``parser`` is locust's configargparse parser (untyped); options go
    on it directly, not in a group, because only its own ``add_argument`` knows ``is_secret`` (masked in the web UI)."""
    parser.add_argument("--model", default="mlp", env_var="LOCUST_MODEL", help="model to infer (default: mlp)")
    parser.add_argument(
        "--rows", type=int, default=1, env_var="LOCUST_ROWS", help="rows (batch dim) per request, for models that batch"
    )
    parser.add_argument(
        "--shape",
        default="",
        env_var="LOCUST_SHAPE",
        help="sizes for the inputs' dynamic dims, batch dim excluded: '32' (every input) or 'image:3,64,64 mask:64'",
    )
    parser.add_argument(
        "--grpc-target",
        default="",
        env_var="LOCUST_GRPC_TARGET",
        help="the gateway's gRPC HOST:PORT (default: --host's name, at the gRPC port GET /v2 advertises, "
        "else at --host's port + 1)",
    )
    parser.add_argument("--api-key", default="", env_var="LOCUST_API_KEY", is_secret=True, help="sent as X-API-Key")
    parser.add_argument(
        "--think-ms", type=float, default=0.0, env_var="LOCUST_THINK_MS", help="pause between a user's requests"
    )
    parser.add_argument(
        "--admin-token",
        default="",
        env_var="SWITCHYARD_ADMIN_TOKEN",
        is_secret=True,
        help="the gateway's admin token; without one the ops user does nothing",
    )
    parser.add_argument(
        "--ops-interval",
        type=float,
        default=10.0,
        env_var="LOCUST_OPS_INTERVAL",
        help="seconds between the ops user's actions (activate, then rollback, ...); 0 turns it off",
    )
    parser.add_argument(
        "--ops-version",
        type=int,
        default=0,
        env_var="LOCUST_OPS_VERSION",
        help="version the ops user activates (default: the highest served version that is not stable)",
    )
    parser.add_argument(
        "--slo-error-ratio",
        type=float,
        default=0.001,
        env_var="LOCUST_SLO_ERROR_RATIO",
        help="most failed requests allowed, as a ratio of all (default 0.001); a negative value turns the gate off",
    )
    parser.add_argument(
        "--slo-p99-ms",
        default="",
        env_var="LOCUST_SLO_P99_MS",
        help="p99 bounds per stats entry, e.g. 'infer-json=50,infer-binary=50,grpc-infer=50' ('all': every request)",
    )


@dataclass(frozen=True)
class LoadOptions:
    host: str
    model: str
    rows: int
    dims: dict[str, tuple[int, ...]]
    grpc_target: GrpcTarget
    api_key: str
    think_s: float
    admin_token: str
    ops_interval_s: float
    ops_version: int
    max_error_ratio: float | None
    p99_ms: dict[str, float]

    @classmethod
    def of(cls, environment: Environment) -> LoadOptions:
        """Raises ValueError naming the option at fault."""
        options = environment.parsed_options
        if options is None:
            raise ValueError("locust started without parsed options")
        host = (environment.host or options.host or "").rstrip("/")
        if options.rows < 1:
            raise ValueError(f"--rows must be at least 1, got {options.rows}")
        return cls(
            host=host,
            model=options.model,
            rows=options.rows,
            dims=parse_dims(options.shape),
            grpc_target=_grpc_target(host, options.grpc_target),
            api_key=options.api_key,
            think_s=max(options.think_ms, 0.0) / 1e3,
            admin_token=options.admin_token,
            ops_interval_s=options.ops_interval,
            ops_version=options.ops_version,
            max_error_ratio=None if options.slo_error_ratio < 0 else options.slo_error_ratio,
            p99_ms=parse_p99(options.slo_p99_ms),
        )

    def http_headers(self) -> dict[str, str]:
        return {"X-API-Key": self.api_key} if self.api_key else {}

    def grpc_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("x-api-key", self.api_key),) if self.api_key else ()


def parse_p99(text: str) -> dict[str, float]:
    """``"infer-json=50,grpc-infer=80"`` → {entry name: milliseconds}."""
    bounds: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        try:
            bound = float(value)
        except ValueError:
            bound = math.nan
        if not name.strip() or not bound >= 0:  # NaN fails the comparison too
            raise ValueError(f"--slo-p99-ms expects ENTRY=MS[,ENTRY=MS...] with MS >= 0, got {item!r}")
        bounds[name.strip()] = bound
    return bounds


def check_options(environment: Environment, **_kwargs: Any) -> None:
    """Listener of ``init``: a bad option stops locust before any user starts, with the reason."""
    if environment.parsed_options is None:  # locust used as a library: nothing of ours to check
        return
    try:
        options = LoadOptions.of(environment)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    log.info("gRPC target %s: %s", options.grpc_target.address, options.grpc_target.rule)
