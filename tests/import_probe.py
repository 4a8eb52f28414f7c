"""Run as ``python -m tests.import_probe REPOSITORY embedded|triton [TRITON_URL]``: starts the gateway on real
ports as ``switchyard serve`` does (the local CPU Triton's twin configs for ``triton``), asks each model's readiness
(waiting up to ``READY_WAIT_S`` for it), and prints as JSON which heavy or build-time modules the process imported,
and why a model was not ready when it was not at first."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import httpx

from services.gateway.backends.triton import ConfigTransform
from services.gateway.settings import Settings
from tests.gateway_harness import running_gateway

ROOT = Path(__file__).resolve().parents[1]
READY_WAIT_S = 30.0
WATCHED = ("torch", "onnx", "onnxscript", "exporter", "services.tritonlocal", "matplotlib")


def main() -> None:
    repository, backend = Path(sys.argv[1]), sys.argv[2]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # to stderr
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the readiness polls would crowd out the gateway's lines
    transform: ConfigTransform | None = None
    settings = Settings(repository=repository, backend=backend, port=0, grpc_port=0)  # type: ignore[arg-type]
    if backend == "triton":
        settings = settings.model_copy(update={"triton_url": sys.argv[3]})
        from services.tritonlocal.derive import derive_config  # what `serve --triton-local-cpu` hands in

        transform = derive_config
    answered, why = {}, {}
    with running_gateway(settings, config_transform=transform) as gateway:
        for model in ("classifier", "mlp"):
            # Up to READY_WAIT_S: what this probe checks is what serving imported, not how soon after start-up a
            # model on a loaded machine's Triton turned ready; the first refusal's reason is kept either way.
            deadline = time.monotonic() + READY_WAIT_S
            while True:
                answer = httpx.get(f"http://{gateway.http_url}/v2/models/{model}/ready")
                if answer.status_code != 200:
                    why.setdefault(model, f"{time.monotonic() - deadline + READY_WAIT_S:.1f} s: {answer.text}")
                if answer.status_code == 200 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            answered[model] = answer.status_code
    print(json.dumps({"answered": answered, "why": why, "imported": watched_modules()}))


def watched_modules() -> list[str]:
    return sorted(name for name in sys.modules if any(name == w or name.startswith(f"{w}.") for w in WATCHED))


def probe(*args: str) -> dict[str, object]:
    """Run this module in a fresh interpreter with ``args`` and return what it printed, with the last lines the
    gateway logged under ``log`` (they say why a model did not load or warm up)."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.import_probe", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    result["log"] = done.stderr[-6000:]
    return result


if __name__ == "__main__":
    main()
