"""Rate limits: the rule table (precedence, bounded bucket keys, validation naming the file and table) and the
local token buckets (burst then refusal, Retry-After rounded up, refill), on an injected clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.gateway.errors import RateLimited
from services.gateway.settings import Settings
from services.gateway.shaping.limits import Limit, LimitsError, LimitTable
from services.gateway.shaping.ratelimit import LocalRateLimiter
from services.gateway.shaping.redis_buckets import RedisRateLimiter
from services.gateway.shaping.shaper import build_rate_limiter

RULES = """
[default]
rps = 100
burst = 200
[tenants.acme]
rps = 500
burst = 1000
[tenants.internal]
rps = 0
[models.classifier]
rps = 20
[tenants.acme.models.classifier]
rps = 50
burst = 60
"""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def limits_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "limits.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_limit_table_gives_each_tenant_a_bucket_when_only_settings_are_set() -> None:
    table = LimitTable(2.5, 0)
    assert table.lookup("acme", "mlp") == ("tenant:acme", Limit(2.5, 3))  # burst: one second's worth, rounded up
    assert table.lookup("beta", "mlp") == ("tenant:beta", Limit(2.5, 3))
    assert LimitTable(0.2, 0).lookup("acme", "mlp") == ("tenant:acme", Limit(0.2, 1))
    assert LimitTable(5, 7).lookup("acme", "mlp") == ("tenant:acme", Limit(5, 7))


def test_limit_table_is_unlimited_when_rps_is_zero() -> None:
    table = LimitTable(0, 10)
    assert not table.limited
    assert table.lookup("acme", "mlp") is None


@pytest.mark.parametrize(
    ("tenant", "model", "bucket", "limit"),
    [
        ("beta", "mlp", "tenant:beta", Limit(100, 200)),
        ("acme", "mlp", "tenant:acme", Limit(500, 1000)),
        ("beta", "classifier", "model:beta:classifier", Limit(20, 20)),
        ("acme", "classifier", "model:acme:classifier", Limit(50, 60)),
        ("acme", "made-up-model", "tenant:acme", Limit(500, 1000)),
    ],
)
def test_limit_table_picks_the_most_specific_rule_when_several_apply(
    tmp_path: Path, tenant: str, model: str, bucket: str, limit: Limit
) -> None:
    table = LimitTable(1, 1, limits_file(tmp_path, RULES))
    assert table.lookup(tenant, model) == (bucket, limit)


def test_limit_table_exempts_a_tenant_when_its_rps_is_zero(tmp_path: Path) -> None:
    table = LimitTable(1, 1, limits_file(tmp_path, RULES))
    assert table.lookup("internal", "mlp") is None
    assert table.lookup("internal", "classifier") == ("model:internal:classifier", Limit(20, 20))


@pytest.mark.parametrize(
    ("rps", "burst", "default", "limit"),
    [(10, 50, "rps = 4", Limit(4, 50)), (10, 0, "rps = 4", Limit(4, 4)), (10, 0, "burst = 1", Limit(10, 1))],
)
def test_limit_table_overrides_the_settings_key_by_key_when_the_file_has_a_default(
    tmp_path: Path, rps: float, burst: int, default: str, limit: Limit
) -> None:
    table = LimitTable(rps, burst, limits_file(tmp_path, f"[default]\n{default}"))
    assert table.lookup("acme", "mlp") == ("tenant:acme", limit)


def test_limit_table_is_limited_when_only_the_file_limits(tmp_path: Path) -> None:
    table = LimitTable(0, 0, limits_file(tmp_path, "[models.classifier]\nrps = 3"))
    assert table.limited
    assert table.lookup("acme", "mlp") is None
    assert table.lookup("acme", "classifier") == ("model:acme:classifier", Limit(3, 3))


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("[default]\nrps = -1", "[default]: rps must be a finite number >= 0"),
        ("[default]\nrps = inf", "[default]: rps must be a finite number >= 0"),
        ("[tenants.acme]\nrps = 1\nburst = 0", "[tenants.acme]: 'burst' must be >= 1"),
        ("[tenants.acme]\nburst = 3", "[tenants.acme]: 'burst' needs an 'rps'"),
        ("[models.m]\nburst = 3", "[models.m]: 'rps' is missing"),
        ('[models.m]\nrps = "fast"', "[models.m]: 'rps' must be a number"),
        ("[models.m]\nrps = true", "[models.m]: 'rps' must be a number"),
        ("[models.m]\nrps = 1\nburst = 1.5", "[models.m]: 'burst' must be a whole number"),
        ("[models.m]\nrps = 1\nrate = 2", "[models.m]: unknown key(s) rate"),
        ("[limits]\nrps = 1", "top level: unknown key(s) limits"),
        ("models = 3", "[models] must be a table"),
        ("[tenants.acme.models.m]\nrps = -2", "[tenants.acme.models.m]: rps must be"),
        ("[tenants]\nacme = 5", "[tenants.acme] must be a table"),
        ("[default\nrps = 1", "is not valid TOML"),
    ],
)
def test_limit_table_names_the_file_and_table_when_a_rule_is_invalid(tmp_path: Path, text: str, complaint: str) -> None:
    path = limits_file(tmp_path, text)
    with pytest.raises(LimitsError) as raised:
        LimitTable(1, 1, path)
    assert str(path) in str(raised.value)
    assert complaint in str(raised.value)


def test_limit_table_fails_when_the_file_is_missing(tmp_path: Path) -> None:
    with pytest.raises(LimitsError, match="cannot be read"):
        LimitTable(1, 1, tmp_path / "absent.toml")


@pytest.mark.parametrize(("rps", "burst"), [(-1.0, 0), (float("nan"), 0), (1.0, -1)])
def test_limit_table_names_the_setting_when_it_is_invalid(rps: float, burst: int) -> None:
    with pytest.raises(LimitsError, match="SWITCHYARD_RATE_LIMIT_"):
        LimitTable(rps, burst)


async def test_local_rate_limiter_refuses_when_the_burst_is_spent() -> None:
    limiter = LocalRateLimiter(LimitTable(2, 3), clock=Clock())
    answers = [await limiter.check("acme", "mlp") for _ in range(4)]
    assert [answer.allowed if answer else None for answer in answers] == [True, True, True, False]
    assert [answer.remaining if answer else None for answer in answers] == [2, 1, 0, 0]
    assert answers[0] is not None
    assert answers[0].headers() == {"x-ratelimit-limit": "3", "x-ratelimit-remaining": "2", "x-ratelimit-reset": "1"}
    assert answers[3] is not None
    assert answers[3].headers() == {
        "x-ratelimit-limit": "3", "x-ratelimit-remaining": "0", "x-ratelimit-reset": "2", "retry-after": "1"
    }
    beta = await limiter.check("beta", "mlp")  # every tenant its own bucket
    assert beta is not None
    assert beta.allowed


@pytest.mark.parametrize(("rps", "retry_after"), [(2, 1), (1, 1), (3, 1), (0.5, 2), (0.3, 4), (0.25, 4), (0.1, 10)])
async def test_decision_rounds_retry_after_up_when_refused(rps: float, retry_after: int) -> None:
    limiter = LocalRateLimiter(LimitTable(rps, 1), clock=Clock())
    await limiter.check("acme", "mlp")
    refused = await limiter.check("acme", "mlp")
    assert refused is not None
    assert not refused.allowed
    assert refused.retry_after == retry_after
    assert refused.headers()["retry-after"] == str(retry_after)


async def test_local_rate_limiter_refills_over_time_when_the_clock_advances() -> None:
    clock = Clock()
    limiter = LocalRateLimiter(LimitTable(2, 2), clock=clock)

    async def allowed() -> bool:
        decision = await limiter.check("acme", "mlp")
        assert decision is not None
        return decision.allowed

    assert [await allowed() for _ in range(3)] == [True, True, False]
    clock.now += 0.25  # half a token: still refused, and the next one is 0.25 s away, which rounds up to 1 s
    decision = await limiter.check("acme", "mlp")
    assert decision is not None
    assert (decision.allowed, decision.retry_after_s, decision.retry_after) == (False, 0.25, 1)
    clock.now += 0.25
    assert [await allowed() for _ in range(2)] == [True, False]
    clock.now += 60  # never more than the burst
    assert [await allowed() for _ in range(3)] == [True, True, False]


async def test_local_rate_limiter_shares_the_tenant_bucket_when_the_model_has_no_rule(tmp_path: Path) -> None:
    limiter = LocalRateLimiter(LimitTable(1, 2, limits_file(tmp_path, "[models.classifier]\nrps = 1")), clock=Clock())
    for model in ("mlp", "made-up-model"):
        decision = await limiter.check("acme", model)
        assert decision is not None
        assert decision.allowed
    refused = await limiter.check("acme", "another-made-up-model")
    assert refused is not None
    assert not refused.allowed
    classifier = await limiter.check("acme", "classifier")  # its own bucket
    assert classifier is not None
    assert classifier.allowed


async def test_decision_raises_rate_limited_with_headers_when_refused(tmp_path: Path) -> None:
    limiter = LocalRateLimiter(LimitTable(2, 3, limits_file(tmp_path, "[models.classifier]\nrps = 0.5")), clock=Clock())
    for _ in range(3):
        decision = await limiter.check("acme", "mlp")
        assert decision is not None
        decision.raise_if_refused()
    refused = await limiter.check("acme", "mlp")
    assert refused is not None
    with pytest.raises(RateLimited) as raised:
        refused.raise_if_refused()
    error = raised.value
    assert str(error) == "rate limit of 2 requests/s (burst 3) exceeded for tenant 'acme'; retry in 1 s"
    assert (error.status, error.reason, error.retry_after_s) == (429, "rate_limit", 1)
    assert dict(error.headers) == {"x-ratelimit-limit": "3", "x-ratelimit-remaining": "0", "x-ratelimit-reset": "2"}

    await limiter.check("acme", "classifier")
    on_model = await limiter.check("acme", "classifier")
    assert on_model is not None
    assert str(on_model.refusal()) == (
        "rate limit of 0.5 requests/s (burst 1) exceeded for tenant 'acme' on model 'classifier'; retry in 2 s"
    )


async def test_build_rate_limiter_picks_the_store_when_settings_ask_for_limits(tmp_path: Path) -> None:
    assert build_rate_limiter(Settings()) is None
    assert isinstance(build_rate_limiter(Settings(rate_limit_rps=5)), LocalRateLimiter)
    shared = build_rate_limiter(Settings(rate_limit_rps=5, redis_url="redis://127.0.0.1:1/0"))
    assert isinstance(shared, RedisRateLimiter)
    await shared.close()
    with pytest.raises(LimitsError):
        build_rate_limiter(Settings(limits_file=tmp_path / "absent.toml"))
