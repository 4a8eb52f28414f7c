"""Triton's error texts and status codes on the embedded backend, over HTTP and gRPC: every row of
tests/error_texts.py (docs/protocol.md, "Error texts"), the rows that need a state of their own in one scenario."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.gateway import Settings
from tests.error_texts import CASES, MODEL, STATELESS, Call, ErrorCase, grpc_answer, http_answer
from tests.gateway_harness import RunningGateway, running_gateway

pytestmark = pytest.mark.slow  # a gateway on real ports


@pytest.fixture(scope="module")
def source(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mlp, versions 1 and 2 (policy ``all``), in a repository the scenario adds a broken version to."""
    root = tmp_path_factory.mktemp("error-texts") / "repository"
    shutil.copytree(repository / MODEL, root / MODEL)
    return root


@pytest.fixture(scope="module")
def gateway(source: Path) -> Iterator[RunningGateway]:
    settings = Settings(repository=source, port=0, grpc_port=0, repository_api_open=True, repository_poll_s=0)
    with running_gateway(settings) as running:
        yield running


def _check_http(gateway: RunningGateway, case: ErrorCase) -> None:
    status, text = http_answer(gateway.http_url, case.call)
    assert (status, text[: len(case.text)]) == (case.http_status, case.text), text


def _check_grpc(gateway: RunningGateway, case: ErrorCase) -> None:
    if not case.grpc_code:
        return
    code, text = grpc_answer(gateway.grpc_url, case.call)
    expected = "" if case.grpc_code == "OK" else case.text
    assert (code, text[: len(expected)]) == (case.grpc_code, expected), text


@pytest.mark.parametrize("case", STATELESS, ids=lambda case: case.case)
def test_answer_starts_with_tritons_text_and_status_when_the_request_is_wrong(
    gateway: RunningGateway, case: ErrorCase
) -> None:
    _check_http(gateway, case)
    _check_grpc(gateway, case)


def test_failed_load_not_ready_version_and_unloaded_model_are_told_in_tritons_words(
    gateway: RunningGateway, source: Path
) -> None:
    """A version 3 that cannot load: the load fails in Triton's words (and so again over gRPC), version 3 is then
    known and not ready; once the model is unloaded it has no available versions. Runs last: it changes the model."""
    shutil.copytree(source / MODEL / "2", source / MODEL / "3")
    (source / MODEL / "3" / "model.onnx").write_bytes(b"\x08\x07 not an onnx graph")
    load_fails, not_ready, unloaded = (next(c for c in CASES if c.case == name) for name in (
        "load: a version fails", "version not ready", "no available versions"))
    for case in (load_fails, not_ready):
        _check_http(gateway, case)
        _check_grpc(gateway, case)
    status, _ = http_answer(gateway.http_url, Call("unload"))
    assert status == 200
    _check_http(gateway, unloaded)
    _check_grpc(gateway, unloaded)
