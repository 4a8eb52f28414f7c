"""Numbers and structures a hostile caller can send the admin, repository and shared-memory APIs (issue #28,
findings 3 and 4): query parameters of 5,000 digits, JSON nested past Python's recursion limit or orjson's, numbers
past 64 bits. Every one is a 400 that names what was wrong, never a 500, and changes nothing."""

from __future__ import annotations

import json

import httpx
import pytest

from services.gateway.shaping.json_limits import MAX_DEPTH, too_deep

ADMIN = {"Authorization": "Bearer s3cret-admin-token"}
DIGITS = "9" * 5000
NESTED = "[" * 1020 + "]" * 1020
"""Within orjson's nesting limit (1,024), past what Python's ``repr`` of the list survives."""
DEEP = "[" * 3000 + "]" * 3000
"""Past orjson's limit: the probe's 3,000 brackets."""
HOSTILE = {"nested": NESTED, "deep": DEEP, "digits": DIGITS, "float digits": "1" + "0" * 400 + ".5"}


@pytest.mark.parametrize(
    ("path", "parameter", "most"),
    [
        ("/admin/models/double/events", "limit", 1000),
        ("/admin/models/double/live", "minutes", 10),
        ("/admin/models/double/live", "step", 60),
    ],
)
@pytest.mark.parametrize("value", [DIGITS, "0", "-1", "1e3", "\u0661", "12345678901234567890"])
async def test_admin_query_answers_400_naming_the_parameter_when_number_is_hostile(
    client: httpx.AsyncClient, path: str, parameter: str, most: int, value: str
) -> None:
    response = await client.get(path, params={parameter: value}, headers=ADMIN)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error.startswith(f"query parameter '{parameter}' must be an integer from 1 to {most}, got "), error
    assert len(error) < 200, error  # what came is quoted trimmed, not 5,000 digits long


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/admin/models/double/versions/2/activate", '{"drain_timeout_s": %s}'),
        ("POST", "/admin/models/double/rollback", '{"keep_previous": %s}'),
        ("POST", "/admin/models/double/versions/2/unload", '{"drain_timeout_s": %s}'),
        ("PUT", "/admin/models/double/traffic", '{"canary": 2, "weight": %s}'),
        ("PUT", "/admin/models/double/traffic", '{"canary": 2, "weight": 5, "rollback": {"window_s": %s}}'),
        ("PUT", "/admin/models/double/shadow", '{"version": 2, "percent": %s}'),
        ("POST", "/admin/models/double/tune", '{"p99_ms": %s}'),
        ("POST", "/v2/repository/index", '{"ready": %s}'),
        ("POST", "/v2/repository/models/double/unload", '{"parameters": {"unload_dependents": %s}}'),
        ("POST", "/v2/repository/models/double/load", '{"parameters": {"config": %s}}'),
        ("POST", "/v2/systemsharedmemory/region/r/register", '{"key": "/k", "byte_size": %s}'),
    ],
)
@pytest.mark.parametrize("value", HOSTILE.values(), ids=HOSTILE.keys())
async def test_admin_and_repository_bodies_answer_400_when_values_are_nested_or_huge(
    client: httpx.AsyncClient, method: str, path: str, body: str, value: str
) -> None:
    before = (await client.get("/admin/models/double", headers=ADMIN)).json()["routing"]
    content = (body % value).encode()
    response = await client.request(method, path, content=content, headers=ADMIN)
    # Admin, repository and shared-memory calls read their JSON through one reader: at most max_body_bytes (4096 here).
    assert response.status_code == (413 if len(content) > 4096 else 400), response.text
    assert len(response.json()["error"]) < 1000, response.text
    assert (await client.get("/admin/models/double", headers=ADMIN)).json()["routing"] == before


# Within this app's 4096-byte body limit; the probe's 3,000 brackets and 5,000 digits go to a gateway on real ports
# (tests/integration/test_repository_api.py).
@pytest.mark.parametrize("config", [NESTED, f'{{"max_batch_size": {NESTED}}}', "[" * 1100 + "]" * 1100,
                                    f'{{"version_policy": {{"latest": {{"num_versions": {"9" * 3000}}}}}}}'])
async def test_repository_load_answers_400_when_config_override_is_nested_or_huge(
    client: httpx.AsyncClient, config: str
) -> None:
    body = httpx.Request("POST", "/", json={"parameters": {"config": config}}).content
    response = await client.post("/v2/repository/models/double/load", content=body, headers=ADMIN)
    assert response.status_code == 400, response.text
    assert "the 'config' parameter is not a ModelConfig in JSON" in response.json()["error"]


def test_too_deep_counts_levels_of_lists_and_objects_when_walking() -> None:
    assert not too_deep(1)
    assert not too_deep([[{"a": [1]}]], limit=4)
    assert too_deep([[{"a": [1]}]], limit=3)
    assert too_deep({"a": {"b": []}}, limit=2)
    assert not too_deep(json.loads("[" * MAX_DEPTH + "]" * MAX_DEPTH))
    assert too_deep(json.loads("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)))


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/admin/models/double/versions/{}/activate"),
        ("POST", "/admin/models/double/versions/{}/load"),
        ("POST", "/admin/models/double/versions/{}/unload"),
        ("POST", "/admin/models/double/versions/{}/compare"),
        ("GET", "/v2/models/double/versions/{}/ready"),
    ],
)
@pytest.mark.parametrize("version", ["-1", "1_0", "\u0661"])
async def test_every_route_refuses_a_version_the_one_parser_refuses(
    client: httpx.AsyncClient, method: str, path: str, version: str
) -> None:
    before = (await client.get("/admin/models/double", headers=ADMIN)).json()["routing"]
    response = await client.request(method, path.format(version), headers=ADMIN)
    assert response.status_code == 400, response.text
    assert "version" in response.json()["error"]
    assert (await client.get("/admin/models/double", headers=ADMIN)).json()["routing"] == before


async def test_admin_errors_take_the_common_error_response_when_the_body_is_too_large(
    client: httpx.AsyncClient,
) -> None:
    content = json.dumps({"drain_timeout_s": 1, "padding": "x" * 5000}).encode()
    response = await client.post("/admin/models/double/versions/2/activate", content=content, headers=ADMIN)
    assert response.status_code == 413
    assert response.json() == {"error": f"request body of {len(content)} bytes exceeds the 4096 byte limit"}
    assert response.headers["connection"] == "close"  # the rest of the body stays unread
