"""REST routes of the model-repository extension, as Triton serves them (``POST /v2/repository/index``,
``/v2/repository/models/{m}/load|unload``), and their OpenAPI description."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from services.gateway.errors import GatewayError, InvalidInput
from services.gateway.repository_api import RepositoryApi
from services.gateway.rest.body import read_json_object
from services.gateway.rest.responses import JSONBytesResponse, gateway_error_response

Handler = Callable[[Request], Awaitable[Response]]
Json = dict[str, Any]


class RepositoryEndpoints:
    def __init__(self, api: RepositoryApi, *, max_body_bytes: int) -> None:
        self._api = api
        self._max_body = max_body_bytes

    async def index(self, request: Request) -> Response:
        async def call(actor: str) -> Any:
            body = await self._body(request, {"ready"})
            ready = body.get("ready", False)
            if not isinstance(ready, bool):
                raise InvalidInput(f"'ready' must be true or false, got {ready!r}")
            # The shaper's check of the caller's API key, if it sent one: its index shows only its models.
            visible = request.app.state.dataplane.shaper.visible_models(request.headers.get("x-api-key"))
            return [entry.to_json() for entry in self._api.index(ready_only=ready, visible=visible)]

        return await self._answer(request, call, operator=False)

    async def load(self, request: Request) -> Response:
        async def call(actor: str) -> Any:
            parameters = await self._parameters(request)
            return (await self._api.load(_model(request), parameters, actor)).to_json()

        return await self._answer(request, call)

    async def unload(self, request: Request) -> Response:
        async def call(actor: str) -> Any:
            parameters = await self._parameters(request)
            return (await self._api.unload(_model(request), parameters, actor)).to_json()

        return await self._answer(request, call)

    async def _answer(
        self, request: Request, call: Callable[[str], Awaitable[Any]], *, operator: bool = True
    ) -> Response:
        """The v2 error shape for every refusal; a load or unload answers its report (Triton answers nothing)."""
        try:
            actor = self._api.authorize(request.headers.get("authorization"), operator=operator)
            return JSONBytesResponse(await call(actor))
        except GatewayError as exc:
            return gateway_error_response(exc)

    async def _parameters(self, request: Request) -> dict[str, Any]:
        parameters = (await self._body(request, {"parameters"})).get("parameters", {})
        if not isinstance(parameters, dict):
            raise InvalidInput(f"'parameters' must be a JSON object, got {type(parameters).__name__}")
        return parameters

    async def _body(self, request: Request, allowed: set[str]) -> Json:
        """The optional JSON object of a repository request, with only the ``allowed`` keys."""
        return await read_json_object(request, self._max_body, allowed=allowed)


def _model(request: Request) -> str:
    return str(request.path_params["model_name"])


def add_repository_routes(app: FastAPI, endpoints: RepositoryEndpoints) -> None:
    routes: list[tuple[str, Handler]] = [
        ("/v2/repository/index", endpoints.index),
        ("/v2/repository/models/{model_name}/load", endpoints.load),
        ("/v2/repository/models/{model_name}/unload", endpoints.unload),
    ]
    for path, handler in routes:
        app.router.routes.append(Route(path, handler, methods=["POST"]))


def repository_paths() -> Json:
    """The OpenAPI description of the routes above."""
    error = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    denied = {
        "401": {"description": "No bearer token.", **error,
                "headers": {"WWW-Authenticate": {"$ref": "#/components/headers/WWW-Authenticate"}}},
        "403": {"description": "Wrong token, or neither a token nor SWITCHYARD_REPOSITORY_API_OPEN configured.",
                **error},
    }
    parameters = {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}}

    def action(operation: str, summary: str, accepted: str, unknown: str) -> Json:
        body = {"type": "object", "properties": {"parameters": {**parameters, "description": accepted}},
                "additionalProperties": False}
        return {"post": {
            "tags": ["repository"], "operationId": operation, "summary": summary, "security": [{"adminToken": []}, {}],
            "parameters": [{"$ref": "#/components/parameters/model_name"}],
            "requestBody": {"required": False, "content": {"application/json": {"schema": body}}},
            "responses": {
                "200": {"description": f"Done; the action's report.{unknown}",
                        "content": {"application/json": {"schema": {"type": "object"}}}},
                "400": {"description": "Malformed request, or a config override the gateway does not take.", **error},
                **denied,
                **({} if unknown else {"404": {"description": "Unknown model.", **error}}),
                "409": {"description": "The model is busy with another action.", **error},
                "413": {"description": "The body exceeds the gateway's limit.", **error},
                "422": {"description": "A version failed to load or warm up; the routing is unchanged.", **error},
                "503": {"description": "The backend or the state store is unavailable.", **error},
            },
        }}

    entry = {"type": "object", "required": ["name", "state"], "properties": {
        "name": {"type": "string"}, "version": {"type": "string"}, "state": {"type": "string"},
        "reason": {"type": "string"}}}
    index_body = {"type": "object", "properties": {"ready": {"type": "boolean"}}, "additionalProperties": False}
    return {
        "/v2/repository/index": {"post": {
            "tags": ["repository"], "operationId": "repositoryIndex", "summary": "Models and versions with their state",
            "security": [{"adminToken": []}, {}],
            "requestBody": {"required": False, "content": {"application/json": {"schema": index_body}}},
            "responses": {
                "200": {"description": "Every model and version of the repository.",
                        "content": {"application/json": {"schema": {"type": "array", "items": entry}}}},
                "400": {"description": "Malformed request.", **error},
                **denied,
                "413": {"description": "The body exceeds the gateway's limit.", **error},
            },
        }},
        "/v2/repository/models/{model_name}/load": action(
            "repositoryLoad", "Load or reload a model through the swap protocol",
            "'config': a JSON ModelConfig whose version_policy applies to this load.", ""),
        "/v2/repository/models/{model_name}/unload": action(
            "repositoryUnload", "Drain and unload every version of a model",
            "'unload_dependents': accepted, no effect.",
            " A model the repository does not have is unloaded already, as in Triton: the report's note says so."),
    }
