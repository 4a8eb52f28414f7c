"""The base install is a serving node: `pip install .` brings no torch, onnx or onnxscript, and from that venv
`switchyard serve` serves the example ONNX models over HTTP and gRPC, reports a TorchScript model as needing the
`export` extra, and `switchyard export` says which extra to install."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from services.tritonlocal import free_ports
from tests.deploy.dockerfile import base_install_command
from tests.gateway_harness import onnx_reference
from tests.import_probe import ROOT
from tests.slow_work import slow_work

BUILD_TIME = {"torch", "onnx", "onnxscript", "onnxruntime-gpu", "matplotlib", "pytest"}


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    slow_work("makes a fresh venv")
    venv = tmp_path_factory.mktemp("base") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    # Build from a copy of the tracked sources: the checkout's own build/ and egg-info stay untouched.
    source = tmp_path_factory.mktemp("source")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True)
    for name in files.stdout.splitlines():
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    # The gateway image's own install command (Dockerfile), so what this module asserts holds for the image too.
    install = subprocess.run(
        [str(venv / "bin" / "python"), *base_install_command(str(source))],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    return venv


@pytest.fixture(scope="module")
def served(example_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """classifier and mlp (ONNX), mlp_ts (TorchScript, which a base install cannot run)."""
    root = tmp_path_factory.mktemp("repository")
    for model in ("classifier", "mlp", "mlp_ts"):
        shutil.copytree(example_repository / model, root / model)
    return root


@pytest.fixture(scope="module")
def gateway(
    base_venv: Path, served: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    http_port, grpc_port = free_ports(2)
    log = tmp_path_factory.mktemp("gateway") / "gateway.log"
    command = [str(base_venv / "bin" / "switchyard"), "serve", "--repository", str(served)]
    command += ["--port", str(http_port), "--grpc-port", str(grpc_port)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD_")}
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{http_port}/v2/health/ready").status_code == 200:
                break
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            pytest.fail(f"the base-install gateway did not get ready:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    yield process, http_port, grpc_port
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.mark.slow
def test_base_install_has_no_build_time_package_when_installed_without_extras(base_venv: Path) -> None:
    listing = subprocess.run(
        [str(base_venv / "bin" / "python"), "-m", "pip", "list", "--format=json"],
        capture_output=True,
        text=True,
        check=True,
    )
    installed = {entry["name"].lower() for entry in json.loads(listing.stdout)}
    assert installed & BUILD_TIME == set()
    assert {"switchyard", "onnxruntime", "tritonclient", "fastapi", "grpcio"} <= installed
    assert installed & {"ml_dtypes", "ml-dtypes"}  # BF16 tensors; pip lists the name as the wheel spells it


@pytest.mark.slow
def test_base_install_serves_onnx_models_over_http_and_grpc_when_started(
    gateway: tuple[subprocess.Popen[bytes], int, int], served: Path
) -> None:
    process, http_port, grpc_port = gateway
    reference = onnx_reference(served)
    features = np.random.default_rng(3).standard_normal((2, 32)).astype(np.float32)
    body = {"inputs": [{"name": "features", "shape": [2, 32], "datatype": "FP32", "data": features.ravel().tolist()}]}
    answer = httpx.post(f"http://127.0.0.1:{http_port}/v2/models/mlp/versions/1/infer", json=body)
    assert answer.status_code == 200, answer.text
    logits = np.array(answer.json()["outputs"][0]["data"], dtype=np.float32).reshape(2, 8)
    np.testing.assert_allclose(logits, reference("mlp", 1, {"features": features})["logits"], rtol=1e-5, atol=1e-5)

    image = np.random.default_rng(4).standard_normal((1, 3, 64, 64)).astype(np.float32)
    with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
        tensor = grpcclient.InferInput("image", [1, 3, 64, 64], "FP32")
        tensor.set_data_from_numpy(image)
        result = client.infer("classifier", [tensor], model_version="2")
    want = reference("classifier", 2, {"image": image})["logits"]
    np.testing.assert_allclose(result.as_numpy("logits"), want, rtol=1e-4, atol=1e-4)

    torchscript = httpx.get(f"http://127.0.0.1:{http_port}/v2/models/mlp_ts/ready")
    assert torchscript.status_code == 503
    assert "pip install 'switchyard[export]'" in torchscript.json()["error"]

    maps = Path(f"/proc/{process.pid}/maps").read_text()
    assert "libtorch" not in maps
    assert "onnx_cpp2py_export" not in maps
    status = Path(f"/proc/{process.pid}/status").read_text().splitlines()
    rss_kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    print(f"base-install gateway RSS serving classifier and mlp (2 versions each): {rss_kib / 1024:.0f} MiB")


@pytest.mark.slow
def test_base_install_export_names_the_extra_when_torch_is_missing(base_venv: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [str(base_venv / "bin" / "switchyard"), "export", "examples.models:build_mlp", "--name", "m"]
        + ["--repository", str(tmp_path / "repository")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: switchyard export needs the 'export' extra (torch is not installed): pip install 'switchyard[export]'"
    ]
    assert not (tmp_path / "repository").exists()
