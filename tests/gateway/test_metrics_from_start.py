"""A routed model's event counters exist at 0 from the start: a series born at its first event reads 1 in its first
sample, which Prometheus's ``increase()`` counts as no increase, so the first switch, canary rollback or refusal of
each kind after a start never showed on the dashboard."""

from __future__ import annotations

import httpx
from prometheus_client import CollectorRegistry

import services.gateway.app  # noqa: F401  # every module that defines an error class, so all are subclasses below
from services.gateway.errors import GatewayError
from services.gateway.metrics import REJECT_REASONS, ROLLBACK_REASONS, SWITCH_RESULTS

AUTH = {"Authorization": "Bearer s3cret-admin-token"}


def _subclasses(cls: type) -> set[type]:
    found = set(cls.__subclasses__())
    for sub in list(found):
        found |= _subclasses(sub)
    return found


async def test_every_event_counter_of_a_routed_model_is_zero_before_its_first_event(
    client: httpx.AsyncClient, registry: CollectorRegistry
) -> None:
    value = registry.get_sample_value
    for result in SWITCH_RESULTS:
        assert value("switchyard_version_switches_total", {"model": "double", "result": result}) == 0
    for reason in ROLLBACK_REASONS:
        assert value("switchyard_canary_rollbacks_total", {"model": "double", "reason": reason}) == 0
    for reason in REJECT_REASONS:
        assert value("switchyard_rejected_total", {"model": "double", "reason": reason}) == 0
    switched = await client.post("/admin/models/double/versions/2/activate", headers=AUTH, json={"compare": False})
    assert switched.status_code == 200, switched.text
    assert registry.get_sample_value("switchyard_version_switches_total", {"model": "double", "result": "ok"}) == 1


def test_the_rejection_reasons_made_at_zero_are_every_reason_an_error_can_give() -> None:
    reasons = {cls.reason for cls in _subclasses(GatewayError) if getattr(cls, "reason", None)}
    assert reasons <= set(REJECT_REASONS), reasons - set(REJECT_REASONS)
