"""Run as ``python -m tests.import_probe REPOSITORY embedded|triton [TRITON_URL]``: starts the gateway on real
ports as ``switchyard serve`` does (the local CPU Triton's twin configs for ``triton``), answers one request per
model, and prints as JSON which heavy or build-time modules the process imported."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import httpx

from services.gateway.backends.triton import ConfigTransform
from services.gateway.settings import Settings
from tests.gateway_harness import running_gateway

ROOT = Path(__file__).resolve().parents[1]
WATCHED = ("torch", "onnx", "onnxscript", "exporter", "services.tritonlocal", "matplotlib")


def main() -> None:
    repository, backend = Path(sys.argv[1]), sys.argv[2]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # to stderr
    transform: ConfigTransform | None = None
    settings = Settings(repository=repository, backend=backend, port=0, grpc_port=0)  # type: ignore[arg-type]
    if backend == "triton":
        settings = settings.model_copy(update={"triton_url": sys.argv[3]})
        from services.tritonlocal.derive import derive_config  # what `serve --triton-local-cpu` hands in

        transform = derive_config
    answered, why = {}, {}
    with running_gateway(settings, config_transform=transform) as gateway:
        for model in ("classifier", "mlp"):
            answer = httpx.get(f"http://{gateway.http_url}/v2/models/{model}/ready")
            answered[model] = answer.status_code
            if answer.status_code != 200:
                why[model] = answer.text
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
