"""The inference lane in front of FastAPI: it answers exactly the two inference routes, like the routes it replaced
(other methods, malformed paths and every other route still go through FastAPI), under a proxy's root path too."""

from __future__ import annotations

import httpx
import pytest
from scripted_backend import ScriptedBackend

from services.gateway.rest import lane
from services.gateway.rest.answer_head import AnswerHeaders
from services.gateway.rest.lane import infer_target

X = {"name": "x", "shape": [2, 4], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6, 7, 8]}


@pytest.mark.parametrize(
    ("method", "path", "root", "target"),
    [
        ("POST", "/v2/models/m/infer", "", ("m", None)),
        ("POST", "/v2/models/m/versions/3/infer", "", ("m", "3")),
        ("POST", "/proxy/v2/models/m/infer", "/proxy", ("m", None)),
        ("GET", "/v2/models/m/infer", "", None),
        ("POST", "/v2/models//infer", "", None),
        ("POST", "/v2/models/m/versions//infer", "", None),
        ("POST", "/v2/models/m/x/3/infer", "", None),
        ("POST", "/v2/models/a/b/infer", "", None),
        ("POST", "/v2/models/m/ready", "", None),
    ],
)
def test_infer_target_picks_only_inference_calls_when_given_a_request(
    method: str, path: str, root: str, target: tuple[str, str | None] | None
) -> None:
    assert infer_target({"type": "http", "method": method, "path": path, "root_path": root}) == target


def test_infer_target_remembers_a_bounded_number_of_paths_when_clients_invent_model_names() -> None:
    lane._TARGETS.clear()
    names = [f"model-{i}" for i in range(lane.TARGETS_CACHED * 3)]
    for _ in range(2):  # a second pass answers from what the first remembered, where it still is
        for name in names:
            assert infer_target({"type": "http", "method": "POST", "path": f"/v2/models/{name}/infer"}) == (name, None)
            assert len(lane._TARGETS) <= lane.TARGETS_CACHED
    long = "m" * lane.TARGET_PATH_CACHED
    path = f"/v2/models/{long}/versions/2/infer"
    assert infer_target({"type": "http", "method": "POST", "path": path}) == (long, "2")
    assert path not in lane._TARGETS  # long paths are parsed each time


async def test_get_on_an_inference_route_answers_405_when_fastapi_routes_it(client: httpx.AsyncClient) -> None:
    response = await client.get("/v2/models/double/infer")
    assert response.status_code == 405


async def test_versioned_inference_is_answered_by_that_version_when_it_goes_through_the_lane(
    client: httpx.AsyncClient, backend: ScriptedBackend
) -> None:
    response = await client.post("/v2/models/double/versions/1/infer", json={"inputs": [X]})
    missing = await client.post("/v2/models/double/versions/2/infer", json={"inputs": [X]})  # not loaded
    assert response.status_code == 200, response.text
    assert response.headers["x-model-version"] == "1"
    assert response.headers["content-type"] == "application/json"
    assert int(response.headers["content-length"]) == len(response.content)
    assert [call[0] for call in backend.calls] == [1]
    assert missing.status_code == 404
    assert "'double' version 2 is not found; loaded versions: 1" in missing.json()["error"]


async def test_malformed_version_in_the_path_answers_400_when_the_lane_parses_it(client: httpx.AsyncClient) -> None:
    response = await client.post("/v2/models/double/versions/1_0/infer", json={"inputs": [X]})
    assert response.status_code == 400
    assert "versions are decimal integers" in response.json()["error"]


@pytest.mark.parametrize("header_length", [None, 57])
def test_answer_headers_render_the_pairs_other_servers_iterate_when_written_directly(header_length: int | None) -> None:
    headers = AnswerHeaders(1234, 7, header_length)
    pairs = list(headers)
    assert headers.rendered() == b"".join(name + b": " + value + b"\r\n" for name, value in pairs)
    assert dict(pairs)[b"content-length"] == b"1234"
    assert dict(pairs)[b"x-model-version"] == b"7"
    binary = header_length is not None
    assert dict(pairs)[b"content-type"] == (b"application/octet-stream" if binary else b"application/json")
    assert dict(pairs).get(b"inference-header-content-length") == (b"57" if binary else None)
