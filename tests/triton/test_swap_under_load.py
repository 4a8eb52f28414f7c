"""Hot version switching in front of the real local Triton: zero failed requests and no misrouted answer while 32
clients send unversioned requests through six switches; loads and unloads go to Triton as full config overrides."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from services.tritonlocal import TritonInstall
from tests.gateway_process import gateway_process
from tests.swap_load import PLAN, TOKEN, switch_under_load
from tests.triton.support import local_triton

pytestmark = pytest.mark.slow  # a local Triton


async def test_switches_under_load_fail_no_request_and_misroute_none_when_32_clients_send(
    install: TritonInstall, repository: Path, tmp_path: Path
) -> None:
    source = tmp_path / "repository"
    for model in ("classifier", "mlp"):
        shutil.copytree(repository / model, source / model)
    options = ("--backend", "triton", "--triton-local-cpu")
    with local_triton(source, tmp_path, install) as server, gateway_process(
        source, tmp_path, token=TOKEN, options=(*options, "--triton-url", server.grpc_url)
    ) as gateway:
        run = await switch_under_load(gateway.http_url)
        print("\n" + run.summary("Triton backend, classifier"))
        assert len(run.flips) == len(PLAN) >= 5
        assert run.failures() == []
        assert run.misrouted() == []
        assert {a.version for a in run.answers} == {1, 2}
        # The last switch was a rollback that keeps both versions: Triton serves exactly the two, settled.
        assert server.model_states("classifier") == {1: "READY", 2: "READY"}
