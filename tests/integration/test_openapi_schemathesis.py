"""The gateway's own OpenAPI document: valid, listing every route it serves, browsable offline at ``/docs``, and true
to what a real gateway answers: a bounded schemathesis run over it finds no server error and no undocumented answer."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, get_args

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import Case, GenerationMode
from schemathesis.checks import CheckFunction
from schemathesis.core.result import Err
from schemathesis.errors import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.specs.openapi.schemas import OpenApiSchema
from starlette.routing import Route

from services.gateway.app import create_app
from services.gateway.errors import InvalidInput
from services.gateway.rest.openapi import DOCS_PATH, paths
from services.gateway.rest.schemas import Datatype
from services.gateway.settings import Settings
from services.gateway.tensors.datatypes import numpy_dtype
from tests.gateway_process import GatewayProcess, gateway_process

pytestmark = pytest.mark.slow

TOKEN = "schemathesis-admin-token"
MODELS = ("mlp", "classifier")
# Admin actions swap versions under the other operations' feet; the read-only admin routes are fuzzed. The generate
# routes' versioned twins run the unversioned ones' code after the version parser every route shares: left out, to
# keep the run short.
OPERATIONS = sorted(
    f"{method.upper()} {path}"
    for path, methods in paths().items()
    for method in methods
    if (not path.startswith("/admin") or method == "get")
    and not (path.endswith(("/generate", "/generate_stream")) and "{model_version}" in path)
)
MAX_EXAMPLES = 50
# The document's own claims, checked on every answer (server errors are asserted apart, with the request).
CONFORMANCE: list[CheckFunction] = [status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """A ``switchyard serve`` process: schemathesis talks to it over a real socket, as any client would."""
    with gateway_process(repository, tmp_path_factory.mktemp("openapi"), token=TOKEN) as running:
        yield running


@pytest.fixture(scope="module")
def schema(server: GatewayProcess) -> OpenApiSchema:
    return schemathesis.openapi.from_url(f"http://{server.http_url}/openapi.json", timeout=10)


@pytest.fixture(scope="module")
def valid_bodies(server: GatewayProcess) -> dict[str, dict[str, Any]]:
    """A one-row request for each model, made from its metadata."""
    bodies = {}
    for name in MODELS:
        metadata = httpx.get(f"http://{server.http_url}/v2/models/{name}", timeout=10).json()
        inputs = [
            {"name": spec["name"], "datatype": spec["datatype"], "shape": shape, "data": [0.5] * math.prod(shape)}
            for spec in metadata["inputs"]
            for shape in [[1 if dim < 0 else dim for dim in spec["shape"]]]
        ]
        bodies[name] = {"inputs": inputs}
    return bodies


def test_openapi_document_validates_when_served(schema: OpenApiSchema) -> None:
    schema.validate()  # the OpenAPI 3.1 meta-schema
    assert schema.raw_schema["openapi"].startswith("3.1")
    assert not [result.err() for result in schema.get_all_operations() if isinstance(result, Err)]


def test_openapi_document_lists_every_route_when_compared_with_the_app(
    schema: OpenApiSchema, repository: Path, tmp_path: Path
) -> None:
    app = create_app(Settings(repository=repository, state_path=tmp_path / "routing.json", grpc_port=None))
    served = {
        (method, route.path)
        for route in app.routes
        if isinstance(route, Route) and route.include_in_schema
        for method in route.methods or ()
        if method != "HEAD"  # Starlette adds HEAD to every GET route
    }
    documented = {(method.upper(), path) for path, item in schema.raw_schema["paths"].items() for method in item}
    assert documented == served


def test_openapi_datatypes_are_the_codecs_when_compared() -> None:
    for datatype in get_args(Datatype):
        numpy_dtype(datatype, "x")  # raises InvalidInput for one the gateway does not decode
    with pytest.raises(InvalidInput):
        numpy_dtype("STRING", "x")  # config.pbtxt's name for BYTES, not a v2 datatype


def test_docs_serve_swagger_ui_from_the_gateway_when_offline(server: GatewayProcess) -> None:
    base = f"http://{server.http_url}"
    page = httpx.get(base + DOCS_PATH, timeout=10)
    assert page.status_code == 200
    assert "/openapi.json" in page.text
    assert "https://" not in page.text.replace("https://swagger.io", "")  # no CDN: nothing fetched from elsewhere
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css", "favicon.png"):
        assert f"{DOCS_PATH}/assets/{asset}" in page.text
        assert httpx.get(f"{base}{DOCS_PATH}/assets/{asset}", timeout=10).status_code == 200


@pytest.mark.parametrize("label", OPERATIONS)
def test_operation_answers_no_server_error_when_fuzzed_by_schemathesis(
    label: str, schema: OpenApiSchema, server: GatewayProcess, valid_bodies: dict[str, dict[str, Any]]
) -> None:
    operation = schema.find_operation_by_label(label)
    assert operation is not None
    base_url = f"http://{server.http_url}"
    headers = {"Authorization": f"Bearer {TOKEN}"} if operation.path.startswith("/admin") else None
    failures: list[str] = []
    with requests.Session() as session:

        @given(case=_cases(operation.path, operation.as_strategy, valid_bodies))
        @settings(
            max_examples=MAX_EXAMPLES,
            derandomize=True,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def fuzz(case: Case[Any]) -> None:
            response = case.call(base_url=base_url, session=session, headers=headers, timeout=30)
            if response.status_code >= 500 and not _deadline_passed(case, response.status_code):
                failures.append(_describe(case, response))
                return
            try:
                case.validate_response(response, checks=CONFORMANCE, headers=headers)
            except FailureGroup as exc:  # the document and the answer disagree
                failures.append(f"{_describe(case, response)}\n{exc}")

        fuzz()
    assert not failures, "\n\n".join(failures[:5])


def _cases(
    path: str, strategy: Callable[..., st.SearchStrategy[Case[Any]]], valid_bodies: dict[str, dict[str, Any]]
) -> st.SearchStrategy[Case[Any]]:
    """Both generation modes, with the model named freely or one the gateway serves (else almost every request
    stops at 404), versions 1 and 2 that exist, and for inference a valid body under generated headers (a generated
    body hardly ever matches a model, so the 200 answers would go unchecked)."""
    fixed: list[dict[str, str]] = [{}]
    if "{model_name}" in path:
        fixed += [{"model_name": name} for name in MODELS]
    if "{model_version}" in path:
        fixed += [{"model_name": name, "model_version": version} for name in MODELS for version in ("1", "2")]
    strategies = [
        strategy(generation_mode=mode, path_parameters=params or None)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        for params in fixed
    ]
    if path.endswith("/infer"):
        strategies += [
            strategy(path_parameters=params, body=valid_bodies[params["model_name"]], media_type="application/json")
            for params in fixed[1:]
        ]
    return st.one_of(strategies)


def _deadline_passed(case: Case[Any], status: int) -> bool:
    """A 504 is the documented answer to a request whose own deadline (µs in the body, ms in a header) ran out."""
    body: object = case.body
    parameters = body.get("parameters") if isinstance(body, Mapping) else None
    named = isinstance(parameters, Mapping) and parameters.get("timeout") not in (None, 0)
    return status == 504 and (named or case.headers.get("X-Request-Timeout") is not None)


def _describe(case: Case[Any], response: schemathesis.Response) -> str:
    body = repr(case.body)
    if len(body) > 800:
        body = f"{body[:800]}... ({len(body)} characters)"
    return (
        f"{case.method} {case.formatted_path} headers={dict(case.headers)} query={case.query} body={body}\n"
        f"-> {response.status_code} {response.content[:500]!r}"
    )
