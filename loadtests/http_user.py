"""The HTTP inference user: KServe v2 requests to one model in JSON and in the binary tensor extension, each answer
checked (outputs' shape, datatype and size, ``X-Model-Version`` against the versions the gateway serves)."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import numpy as np
from kserve_tensors import (
    ModelSpec,
    ServedVersions,
    WrongAnswer,
    binary_answer,
    binary_body,
    json_answer,
    json_body,
    random_inputs,
)
from load_options import LoadOptions
from locust import FastHttpUser, task
from locust.exception import StopUser
from request_events import fire_failure

SAMPLES = 4
"""Request bodies built per user at start and sent in turn: encoding JSON per request would load the load generator."""
RETRY_S = 1.0


class InferenceUser(FastHttpUser):
    weight = 2
    network_timeout = 30.0
    connection_timeout = 10.0

    options: LoadOptions
    spec: ModelSpec | None = None
    versions: ServedVersions
    json_bodies: list[bytes]
    binary_bodies: list[tuple[bytes, dict[str, str]]]
    turn = 0

    def wait_time(self) -> float:
        # Without a spec the user waits a little before asking for the metadata again, rather than spinning.
        return self.options.think_s if self.spec is not None else RETRY_S

    def on_start(self) -> None:
        self.options = LoadOptions.of(self.environment)
        self.path = f"/v2/models/{quote(self.options.model, safe='')}"
        self.headers = self.options.http_headers()

    @task
    def infer_json(self) -> None:
        if self.spec is not None or self._read_spec():
            body = self.json_bodies[self.turn % SAMPLES]
            self._infer("infer-json", body, {"Content-Type": "application/json"}, binary=False)

    @task
    def infer_binary(self) -> None:
        if self.spec is not None or self._read_spec():
            body, headers = self.binary_bodies[self.turn % SAMPLES]
            self._infer("infer-binary", body, headers, binary=True)

    def _infer(self, name: str, body: bytes, headers: dict[str, str], *, binary: bool) -> None:
        assert self.spec is not None
        self.turn += 1
        with self.client.post(
            f"{self.path}/infer",
            data=body,  # type: ignore[arg-type]  # locust annotates str | dict; geventhttpclient sends bytes as is
            headers={**self.headers, **headers},
            name=name,
            catch_response=True,
        ) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {_snippet(response.content)}")
                return
            answer_headers = response.headers or {}
            try:
                if binary:
                    length = answer_headers.get("Inference-Header-Content-Length")
                    if length is None:
                        raise WrongAnswer("a binary answer without Inference-Header-Content-Length")
                    version = binary_answer(self.spec, self.options.rows, response.content or b"", int(length))
                else:
                    version = json_answer(self.spec, self.options.rows, response.content or b"")
                header = answer_headers.get("X-Model-Version")
                if header is None:
                    raise WrongAnswer("the answer has no X-Model-Version header")
                self.versions.check(version, header)
            except (WrongAnswer, ValueError, KeyError, TypeError) as exc:
                response.failure(f"wrong answer: {type(exc).__name__}: {exc}")
            else:
                response.success()

    def _read_spec(self) -> bool:
        """The model's metadata and config, then the request bodies built from them; False when they are not there
        (the failed request is in the stats)."""
        metadata = self._get_json("metadata", self.path)
        config = self._get_json("config", f"{self.path}/config") if metadata is not None else None
        if metadata is None or config is None:
            return False
        try:
            spec = ModelSpec.from_metadata(metadata, int(config.get("max_batch_size", 0)))
            rng = np.random.default_rng()
            samples = [random_inputs(spec, self.options.rows, self.options.dims, rng) for _ in range(SAMPLES)]
        except (ValueError, KeyError, TypeError) as exc:
            # A model the load test cannot drive (or a --shape that does not fit it): one failure that says why,
            # and this user stops rather than failing every request the same way.
            fire_failure(self.environment, "GET", "metadata", exc)
            raise StopUser() from exc
        self.json_bodies = [json_body(spec, arrays) for arrays in samples]
        self.binary_bodies = [binary_body(spec, arrays) for arrays in samples]
        self.versions = ServedVersions(spec.versions, self._served)
        self.spec = spec
        return True

    def _served(self) -> list[str]:
        metadata = self._get_json("metadata", self.path)
        return [] if metadata is None else [str(v) for v in metadata.get("versions", [])]

    def _get_json(self, name: str, path: str) -> dict[str, Any] | None:
        with self.client.get(path, headers=self.headers, name=name, catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {_snippet(response.content)}")
                return None
            try:
                data = json.loads(response.content or b"")
            except ValueError as exc:
                response.failure(f"not JSON: {exc}")
                return None
            if not isinstance(data, dict):
                response.failure("not a JSON object")
                return None
            response.success()
            return data


def _snippet(content: bytes | None) -> str:
    return (content or b"")[:200].decode(errors="replace")
