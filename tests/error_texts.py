"""The error texts the gateway shares with Triton, one row per case: what docs/protocol.md's "Error texts" table
says, and how to make the request over HTTP and gRPC. The embedded (tests/integration/test_error_texts.py) and the
Triton (tests/triton/test_error_texts_triton.py) tests run the rows; tests/test_docs.py keeps the table true."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import numpy.typing as npt
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

MODEL = "mlp"
"""The example mlp: input features FP32 [-1, 32], outputs logits and probabilities, max_batch_size 32."""
Tensor = tuple[str, str, tuple[int, ...]]
FEATURES: Tensor = ("features", "FP32", (1, 32))


@dataclass(frozen=True)
class Call:
    """One request. ``kind``: infer, metadata, config, stats, load, unload, or raw (an HTTP infer body as given)."""

    kind: str
    model: str = MODEL
    version: int | None = None
    inputs: tuple[Tensor, ...] = (FEATURES,)
    outputs: tuple[str, ...] = ()
    config: str | None = None
    """A load's ``config`` override."""
    body: bytes = b""
    """A raw call's HTTP body."""


@dataclass(frozen=True)
class ErrorCase:
    case: str
    """The table's first column."""
    http_status: int
    grpc_code: str
    """The ``grpc.StatusCode`` name; empty where the case has no gRPC form."""
    wording: str
    """The text as the table gives it: Triton's words, ``<model>`` and the like standing for names."""
    text: str
    """What this row's ``call`` must be answered with: the answer starts with it."""
    call: Call
    state: bool = False
    """Needs a state of its own (a failed load, an unloaded model): run in the embedded backend's scenario only."""
    note: str = field(default="", compare=False)


CASES = (
    ErrorCase("unknown model", 404, "NOT_FOUND", "Request for unknown model: '<model>' is not found",
              "Request for unknown model: 'nope' is not found", Call("infer", model="nope")),
    ErrorCase("unknown version", 404, "NOT_FOUND", "Request for unknown model: '<model>' version <v> is not found",
              "Request for unknown model: 'mlp' version 7 is not found; loaded versions: 1, 2",
              Call("infer", version=7)),
    ErrorCase("unknown model: metadata", 404, "NOT_FOUND", "Request for unknown model: '<model>' is not found",
              "Request for unknown model: 'nope' is not found", Call("metadata", model="nope")),
    ErrorCase("unknown model: config", 404, "NOT_FOUND", "Request for unknown model: '<model>' is not found",
              "Request for unknown model: 'nope' is not found", Call("config", model="nope")),
    ErrorCase("unknown version: metadata", 404, "NOT_FOUND",
              "Request for unknown model: '<model>' version <v> is not found",
              "Request for unknown model: 'mlp' version 7 is not found", Call("metadata", version=7)),
    ErrorCase("unknown model: statistics", 404, "NOT_FOUND", "requested model '<model>' is not available",
              "requested model 'nope' is not available", Call("stats", model="nope"),
              note="Triton: 400 / INVALID_ARGUMENT"),
    ErrorCase("unknown version: statistics", 404, "NOT_FOUND",
              "requested model version is not available for model '<model>'",
              "requested model version is not available for model 'mlp'", Call("stats", version=7),
              note="Triton: 400 / INVALID_ARGUMENT"),
    ErrorCase("unexpected input", 400, "INVALID_ARGUMENT", "unexpected inference input '<input>' for model '<model>'",
              "unexpected inference input 'pixels' for model 'mlp'; expected inputs: 'features'",
              Call("infer", inputs=(("pixels", "FP32", (1, 32)),))),
    ErrorCase("unexpected output", 400, "INVALID_ARGUMENT",
              "unexpected inference output '<output>' for model '<model>'",
              "unexpected inference output 'scores' for model 'mlp'", Call("infer", outputs=("scores",))),
    ErrorCase("wrong datatype", 400, "INVALID_ARGUMENT",
              "inference input '<input>' data-type is '<given>', but model '<model>' expects '<declared>'",
              "inference input 'features' data-type is 'INT32', but model 'mlp' expects 'FP32'",
              Call("infer", inputs=(("features", "INT32", (1, 32)),))),
    ErrorCase("wrong shape", 400, "INVALID_ARGUMENT",
              "unexpected shape for input '<input>' for model '<model>'. Expected <dims>, got <shape>",
              "unexpected shape for input 'features' for model 'mlp'. Expected [-1,32], got [2,16]",
              Call("infer", inputs=(("features", "FP32", (2, 16)),))),
    ErrorCase("batch too large", 400, "INVALID_ARGUMENT",
              "inference request batch-size must be <= <max_batch_size> for '<model>'",
              "inference request batch-size must be <= 32 for 'mlp'",
              Call("infer", inputs=(("features", "FP32", (33, 32)),))),
    ErrorCase("missing input", 400, "INVALID_ARGUMENT",
              "expected <n> inputs but got <m> inputs for model '<model>'",
              "expected 1 inputs but got 0 inputs for model 'mlp'. Got input(s) [], but missing required input(s) "
              "['features']", Call("infer", inputs=())),
    ErrorCase("input given twice", 400, "INVALID_ARGUMENT", "input '<input>' already exists in request",
              "input 'features' already exists in request", Call("infer", inputs=(FEATURES, FEATURES))),
    ErrorCase("malformed JSON", 400, "", "failed to parse the request JSON buffer",
              "failed to parse the request JSON buffer", Call("raw", body=b"{bad json"),
              note="Triton: 500"),
    ErrorCase("load: unknown model", 404, "NOT_FOUND",
              "failed to load '<model>', failed to poll from model repository",
              "failed to load 'nope', failed to poll from model repository", Call("load", model="nope"),
              note="Triton: 500 / INTERNAL"),
    ErrorCase("load: bad config override", 400, "INVALID_ARGUMENT",
              "failed to load '<model>', failed to poll from model repository",
              "failed to load 'mlp', failed to poll from model repository; the 'config' parameter is not a "
              "ModelConfig in JSON", Call("load", config="{bad json"), note="Triton: 500 / INTERNAL"),
    ErrorCase("unload: unknown model", 200, "OK", "model '<model>' is not in the repository: nothing to unload",
              "model 'nope' is not in the repository: nothing to unload", Call("unload", model="nope"),
              note="as Triton: success"),
    ErrorCase("load: a version fails", 422, "FAILED_PRECONDITION",
              "load failed for model '<model>': version <v> is at UNAVAILABLE state: <cause>",
              "load failed for model 'mlp': version 3 is at UNAVAILABLE state: ", Call("load"), state=True,
              note="Triton: 400 / INVALID_ARGUMENT"),
    ErrorCase("version not ready", 503, "UNAVAILABLE",
              "Request for unknown model: '<model>' version <v> is not at ready state",
              "Request for unknown model: 'mlp' version 3 is not at ready state; unavailable: ",
              Call("infer", version=3), state=True),
    ErrorCase("no available versions", 404, "NOT_FOUND",
              "Request for unknown model: '<model>' has no available versions",
              "Request for unknown model: 'mlp' has no available versions; unloaded through the repository API",
              Call("infer"), state=True, note="unloaded through the repository API"),
)
STATELESS = tuple(case for case in CASES if not case.state)


def table_row(case: ErrorCase) -> str:
    """How the row starts in docs/protocol.md (the note column after it is free text)."""
    code = f"`{case.grpc_code}`" if case.grpc_code else "(HTTP only)"
    return f"| {case.case} | {case.http_status} | {code} | `{case.wording}` |"


def pattern(wording: str) -> re.Pattern[str]:
    """The wording as a pattern: each ``<name>`` stands for any text."""
    parts = re.split(r"<[a-z_]+>", wording)
    return re.compile(".*?".join(re.escape(part) for part in parts))


def _array(datatype: str, shape: tuple[int, ...]) -> npt.NDArray[Any]:
    return np.zeros(shape, dtype=np.float32 if datatype == "FP32" else np.int32)


def http_answer(http_url: str, call: Call) -> tuple[int, str]:
    """The status and the error text (or, for a success, the report's note) of ``call`` over HTTP."""
    base = f"http://{http_url}/v2"
    model = f"{base}/models/{call.model}" + (f"/versions/{call.version}" if call.version is not None else "")
    with httpx.Client(timeout=60, trust_env=False) as client:
        if call.kind in ("infer", "raw"):
            body = {
                "inputs": [
                    {"name": n, "datatype": d, "shape": list(s), "data": _array(d, s).ravel().tolist()}
                    for n, d, s in call.inputs
                ],
                **({"outputs": [{"name": name} for name in call.outputs]} if call.outputs else {}),
            }
            response = (
                client.post(f"{model}/infer", content=call.body) if call.kind == "raw"
                else client.post(f"{model}/infer", json=body)
            )
        elif call.kind in ("metadata", "config", "stats"):
            response = client.get(model if call.kind == "metadata" else f"{model}/{call.kind}")
        else:
            parameters = {"parameters": {"config": call.config}} if call.config is not None else {}
            response = client.post(f"{base}/repository/models/{call.model}/{call.kind}", json=parameters)
    answer = response.json()
    return response.status_code, str(answer.get("error") if response.status_code >= 400 else answer.get("note"))


def grpc_answer(grpc_url: str, call: Call) -> tuple[str, str]:
    """The status code's name and the message of ``call`` over gRPC (``OK`` and "" for a success)."""
    version = "" if call.version is None else str(call.version)
    with grpcclient.InferenceServerClient(grpc_url) as client:
        try:
            if call.kind == "infer":
                inputs = []
                for name, datatype, shape in call.inputs:
                    tensor = grpcclient.InferInput(name, list(shape), datatype)
                    tensor.set_data_from_numpy(_array(datatype, shape))
                    inputs.append(tensor)
                outputs = [grpcclient.InferRequestedOutput(name) for name in call.outputs] or None
                client.infer(call.model, inputs, model_version=version, outputs=outputs)
            elif call.kind == "metadata":
                client.get_model_metadata(call.model, version)
            elif call.kind == "config":
                client.get_model_config(call.model, version)
            elif call.kind == "stats":
                client.get_inference_statistics(call.model, version)
            elif call.kind == "load":
                client.load_model(call.model, config=call.config)
            elif call.kind == "unload":
                client.unload_model(call.model)
            else:
                raise AssertionError(f"{call.kind} has no gRPC form")
        except InferenceServerException as exc:
            return str(exc.status()).removeprefix("StatusCode."), str(exc.message())
    return grpc.StatusCode.OK.name, ""


def malformed_version(shown: str) -> str:
    """The answer to a version string that is no version (``shown``: the string as the gateway quotes it)."""
    return (
        f"failed to get model version from specified version string {shown}; "
        f"versions are decimal integers like 1 or 12, got {shown}"
    )


def check_http(http_url: str, case: ErrorCase) -> None:
    status, text = http_answer(http_url, case.call)
    assert (status, text[: len(case.text)]) == (case.http_status, case.text), text


def check_grpc(grpc_url: str, case: ErrorCase) -> None:
    if not case.grpc_code:
        return
    code, text = grpc_answer(grpc_url, case.call)
    expected = "" if case.grpc_code == "OK" else case.text
    assert (code, text[: len(expected)]) == (case.grpc_code, expected), text


def check_stateful_rows(http_url: str, grpc_url: str, source: Path) -> None:
    """A version 3 that cannot load: the load fails in Triton's words (and so again over gRPC), version 3 is then
    known and not ready; once the model is unloaded it has no available versions. Changes the model: run it last."""
    shutil.copytree(source / MODEL / "2", source / MODEL / "3")
    (source / MODEL / "3" / "model.onnx").write_bytes(b"\x08\x07 not an onnx graph")
    load_fails, not_ready, unloaded = (next(c for c in CASES if c.case == name) for name in (
        "load: a version fails", "version not ready", "no available versions"))
    for case in (load_fails, not_ready):
        check_http(http_url, case)
        check_grpc(grpc_url, case)
    status, text = http_answer(http_url, Call("unload"))
    assert status == 200, text
    check_http(http_url, unloaded)
    check_grpc(grpc_url, unloaded)


def scenario_repository(repository: Path, tmp_path_factory: Any) -> Path:
    """mlp, versions 1 and 2 (policy ``all``), copied from ``repository``: the scenario adds a broken version."""
    root = Path(tmp_path_factory.mktemp("error-texts")) / "repository"
    shutil.copytree(repository / MODEL, root / MODEL)
    return root
