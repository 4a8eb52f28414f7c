"""The naive baseline the gateway is measured against: a FastAPI + onnxruntime endpoint per example model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from workload import MODELS, latest_onnx


class NaiveRequest(BaseModel):
    data: list[Any]


def naive_app(repository: Path, threads: int) -> FastAPI:
    """What most teams write first: pydantic JSON body, one session.run per request, JSON lists back."""
    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    def endpoint(model: str) -> Callable[[NaiveRequest], dict[str, Any]]:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(str(latest_onnx(repository, model)), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        input_name = session.get_inputs()[0].name

        def predict(body: NaiveRequest) -> dict[str, Any]:
            outputs = session.run(names, {input_name: np.asarray(body.data, dtype=np.float32)})
            return {"outputs": {name: value.tolist() for name, value in zip(names, outputs, strict=True)}}

        return predict

    for model in MODELS:
        app.post(f"/predict/{model}")(endpoint(model))
    return app


def serve_naive(repository: Path, port: int, threads: int) -> None:
    uvicorn.run(naive_app(repository, threads), host="127.0.0.1", port=port, log_level="warning")
