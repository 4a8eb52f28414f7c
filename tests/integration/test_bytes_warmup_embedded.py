"""BYTES models other tools made, on the embedded backend: served although the warm-up the gateway invents for
them fails (the failure is logged, counted and noted in the repository index), and a declared ``model_warmup`` of
strings that warms the version up or refuses it, as Triton does."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from services.gateway.settings import Settings
from tests.bytes_warmup_models import (
    ABSENT,
    DECIMALS,
    EMPTY_STRINGS,
    bytes_warmup_repository,
    expected_sums,
    grpc_add_sub,
    http_add_sub,
    identity,
    index,
)
from tests.gateway_harness import RunningGateway, running_gateway
from tests.simple_models import shared_simple_repository
from tests.string_models import TEXT

pytestmark = pytest.mark.slow  # a gateway on real ports, the simple models exported
FAILURES = "switchyard_invented_warmup_failures_total"


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def warmup_log() -> Iterator[list[logging.LogRecord]]:
    """What the version manager logs while the module's gateway starts (caplog is per test)."""
    handler, logger = _Kept(), logging.getLogger("services.gateway.versions.manager")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    yield handler.records
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, warmup_log: list[logging.LogRecord]
) -> Iterator[RunningGateway]:
    root = bytes_warmup_repository(shared_simple_repository(tmp_path_factory), tmp_path_factory.mktemp("bytes"))
    with running_gateway(Settings(repository=root, port=0, grpc_port=0, repository_api_open=True)) as running:
        yield running


@pytest.mark.parametrize("binary", [False, True])
def test_simple_string_adds_decimal_strings_when_http_sends_json_or_binary(
    gateway: RunningGateway, binary: bool
) -> None:
    assert http_add_sub(gateway.http_url, "simple_string", binary=binary) == expected_sums()


@pytest.mark.parametrize("typed", [False, True])
def test_simple_string_adds_decimal_strings_when_grpc_sends_raw_or_bytes_contents(
    gateway: RunningGateway, typed: bool
) -> None:
    assert grpc_add_sub(gateway.grpc_url, "simple_string", typed=typed) == expected_sums()


def test_simple_identity_answers_the_exact_strings_when_nothing_declares_its_warm_up(gateway: RunningGateway) -> None:
    values = [t.encode() for t in TEXT]
    assert identity(gateway.grpc_url, values) == values
    assert "reason" not in index(gateway.http_url)["simple_identity"]  # empty strings warmed it: nothing to note
    assert gateway.metric(FAILURES, model="simple_identity") == 0


def test_failed_invented_warm_up_is_noted_counted_and_logged_when_the_version_serves_anyway(
    gateway: RunningGateway, warmup_log: list[logging.LogRecord]
) -> None:
    entry = index(gateway.http_url)["simple_string"]
    assert entry["state"] == "READY"
    assert entry["reason"].startswith("serving without a full warm-up: warm-up request (zero-filled inputs")
    assert gateway.metric(FAILURES, model="simple_string") == 1
    warnings = [r.getMessage() for r in warmup_log if r.levelno == logging.WARNING]
    assert any(m.startswith("model 'simple_string' version 1 is serving without a full warm-up") for m in warnings)


def test_declared_model_warmup_of_decimal_strings_warms_the_version_when_its_file_holds_them(
    gateway: RunningGateway, warmup_log: list[logging.LogRecord]
) -> None:
    assert index(gateway.http_url)[DECIMALS] == {"name": DECIMALS, "version": "1", "state": "READY"}
    messages = [r.getMessage() for r in warmup_log]
    assert f"warmed model '{DECIMALS}' version 1 with model_warmup 'decimals' (batch 2)" in messages
    assert http_add_sub(gateway.http_url, DECIMALS, binary=True) == expected_sums()


def test_declared_model_warmup_refuses_the_version_with_its_reason_when_the_model_cannot_answer_it(
    gateway: RunningGateway,
) -> None:
    entry = index(gateway.http_url)[EMPTY_STRINGS]
    assert entry["state"] == "UNAVAILABLE"
    assert "warm-up failed: warm-up request (model_warmup 'empty_strings' (batch 1)) failed" in entry["reason"]
    assert gateway.metric(FAILURES, model=EMPTY_STRINGS) == 0  # declared data: a refusal, not a note


def test_declared_model_warmup_refuses_the_version_with_its_reason_when_its_file_is_missing(
    gateway: RunningGateway,
) -> None:
    entry = index(gateway.http_url)[ABSENT]
    assert entry["state"] == "UNAVAILABLE"
    assert "warm-up failed: model_warmup 'absent': cannot read " in entry["reason"]
    assert "absent.bin: No such file or directory" in entry["reason"]
