"""The Triton backend warns about models Triton 2.51 may stall: one instance with dynamic batching."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from services.gateway.backends.triton import identity
from services.tritonlocal import free_port
from tests.triton.support import gateway_settings, started_backend

pytestmark = pytest.mark.slow  # the examples' export


def copy_with_instances(source: Path, target: Path, count: int) -> Path:
    shutil.copytree(source / "mlp", target / "mlp")
    config = target / "mlp" / "config.pbtxt"
    text = config.read_text()
    assert "count: 2" in text
    config.write_text(text.replace("count: 2", f"count: {count}"))
    return target


@pytest.mark.parametrize(("count", "warned"), [(1, True), (2, False)])
async def test_backend_warns_when_a_model_has_one_instance_with_dynamic_batching(
    example_repository: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, count: int, warned: bool
) -> None:
    repository = copy_with_instances(example_repository, tmp_path / "repository", count)
    # Nothing listens there: start() only reads the repository and notes that Triton is not up yet.
    with caplog.at_level(logging.WARNING, logger="services.gateway.backends.triton"):
        backend = await started_backend(
            repository, gateway_settings(f"127.0.0.1:{free_port()}", repository), transform=identity
        )
        await backend.close()
    messages = [r.getMessage() for r in caplog.records if "one instance" in r.getMessage()]
    assert bool(messages) is warned, messages
    if warned:
        assert "model 'mlp'" in messages[0]
        assert "--instances 2" in messages[0]
