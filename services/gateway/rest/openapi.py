"""The OpenAPI document of the v2 REST and admin routes (plain Starlette routes, which FastAPI cannot describe by
itself); ``rest/docs_ui.py`` renders it at ``/docs``."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue, models_json_schema
from pydantic_core import core_schema

from services.gateway.rest import schemas
from services.gateway.rest.docs_ui import DOCS_PATH, install_docs
from services.gateway.rest.health_schemas import RESPONSE_MODELS as HEALTH_MODELS
from services.gateway.rest.repository_routes import repository_paths
from services.gateway.rest.shared_memory import shared_memory_paths
from services.gateway.rest.statistics_schemas import RESPONSE_MODELS as STATISTICS_MODELS
from services.gateway.rest.statistics_schemas import statistics_paths

__all__ = ["DOCS_PATH", "build_document", "install_openapi"]

_REF = "#/components/schemas/{model}"

Json = dict[str, Any]


def install_openapi(app: FastAPI) -> None:
    """Serve the document at ``app.openapi_url`` and Swagger UI at ``/docs``; call once the routes are added."""

    def openapi() -> Json:
        if app.openapi_schema is None:
            app.openapi_schema = build_document(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to replace the document

    install_docs(app)


def build_document(app: FastAPI) -> Json:
    """FastAPI's document (its own routes, if any) plus the v2 and admin routes and their models."""
    document = get_openapi(
        title=app.title,
        version=app.version,
        description="KServe v2 inference protocol (REST) and the gateway's admin API.",
        routes=app.routes,
        tags=TAGS,
    )
    document.setdefault("paths", {}).update(paths())
    components = document.setdefault("components", {})
    components.setdefault("schemas", {}).update(_schemas())
    components["parameters"] = PARAMETERS
    components["headers"] = HEADERS
    components["securitySchemes"] = {
        "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key",
                   "description": "Needed when the gateway runs with API keys (SWITCHYARD_API_KEYS)."},
        "adminToken": {"type": "http", "scheme": "bearer", "description": "The gateway's SWITCHYARD_ADMIN_TOKEN."},
    }
    return document


class _NoNullDefaults(GenerateJsonSchema):
    """Optional fields are written as absent-or-typed: a ``default: null`` would contradict their type."""

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        if schema.get("default", ...) is None:
            return self.generate_inner(schema["schema"])
        return super().default_schema(schema)


def _schemas() -> Json:
    models: list[type[BaseModel]] = [
        *schemas.REQUEST_MODELS, *schemas.RESPONSE_MODELS, *STATISTICS_MODELS, *HEALTH_MODELS
    ]
    _, definitions = models_json_schema(
        [(model, "validation") for model in models], ref_template=_REF, schema_generator=_NoNullDefaults
    )
    found: Json = definitions.get("$defs", {})
    return found


def _ref(kind: str, name: str) -> Json:
    return {"$ref": f"#/components/{kind}/{name}"}


def _json(description: str, *headers: str, model: str = "Error") -> Json:
    """A JSON answer (the v2 error shape unless ``model`` says otherwise) with the named response headers."""
    response: Json = {"description": description, "content": {"application/json": {"schema": _ref("schemas", model)}}}
    if headers:
        response["headers"] = {name: _ref("headers", name) for name in headers}
    return response


TAGS = [
    {"name": "health", "description": "Liveness and readiness (KServe v2)."},
    {"name": "metadata", "description": "Server and model metadata, readiness and configuration (KServe v2)."},
    {"name": "inference", "description": "Inference, JSON or with the binary tensor data extension (KServe v2)."},
    {"name": "metrics", "description": "Prometheus metrics."},
    {"name": "admin", "description": "Version actions and status (bearer token)."},
]

_VERSION_PATTERN = "^[1-9][0-9]{0,17}$"
PARAMETERS: Json = {
    "model_name": {"name": "model_name", "in": "path", "required": True,
                   "schema": {"type": "string", "minLength": 1}, "description": "The model's name."},
    "model_version": {"name": "model_version", "in": "path", "required": True,
                      "schema": {"type": "string", "pattern": _VERSION_PATTERN},
                      "description": "A version number (decimal digits)."},
    "X-Request-Timeout": {"name": "X-Request-Timeout", "in": "header", "required": False,
                          "schema": {"type": "number", "exclusiveMinimum": 0},
                          "description": "Deadline in milliseconds; the shortest one a request names applies."},
    "X-Priority": {"name": "X-Priority", "in": "header", "required": False, "schema": {"type": "integer", "minimum": 0},
                   "description": "1 is the highest priority; 0: the gateway's default. The body's priority wins."},
    "Inference-Header-Content-Length": {
        "name": "Inference-Header-Content-Length", "in": "header", "required": False,
        "schema": {"type": "integer", "minimum": 1},
        "description": "Binary tensor data extension: bytes of JSON header before the raw tensors "
                       "(application/octet-stream bodies).",
    },
    "limit": {"name": "limit", "in": "query", "required": False,
              "schema": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
              "description": "Most recent events to return."},
}
HEADERS: Json = {
    "Retry-After": {"schema": {"type": "integer", "minimum": 0}, "description": "Seconds after which to retry."},
    "X-Model-Version": {"schema": {"type": "string", "pattern": "^[0-9]+$"},
                        "description": "The version that served (or failed) the request."},
    "Inference-Header-Content-Length": {"schema": {"type": "integer", "minimum": 1},
                                        "description": "Bytes of JSON header before the binary outputs."},
    "X-RateLimit-Limit": {"schema": {"type": "integer", "minimum": 0},
                          "description": "Requests the caller's bucket holds (rate limiting on)."},
    "X-RateLimit-Remaining": {"schema": {"type": "integer", "minimum": 0},
                              "description": "Requests left in the caller's bucket now."},
    "X-RateLimit-Reset": {"schema": {"type": "integer", "minimum": 0},
                          "description": "Whole seconds until the bucket is full again."},
    "X-Request-Id": {"schema": {"type": "string"}, "description": "Finds the failure's cause in the gateway's log."},
    "WWW-Authenticate": {"schema": {"type": "string"}, "description": "The bearer realm."},
}

_API_KEY: list[Json] = [{}, {"apiKey": []}]  # optional: only a gateway started with API keys asks for one
_ADMIN: list[Json] = [{"adminToken": []}]
_RATE = ("X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset")


def _target_errors(not_ready: Json) -> Json:
    """The answers every model-addressed v2 route shares."""
    return {
        "400": _json("Malformed request."),
        "401": _json("An API key is needed (API keys on, metadata protected) or is not valid."),
        "404": _json("Unknown model or version."),
        "503": not_ready,
    }


def _model_routes(suffix: str, operation: str, method: str, spec: Json) -> Json:
    """The unversioned route and its ``/versions/{model_version}`` twin."""
    base = "/v2/models/{model_name}"
    name_only = [_ref("parameters", "model_name")]
    versioned = [*name_only, _ref("parameters", "model_version")]
    return {
        f"{base}{suffix}": {method: {**spec, "operationId": operation, "parameters": name_only + spec["parameters"]}},
        f"{base}/versions/{{model_version}}{suffix}": {
            method: {**spec, "operationId": f"{operation}Version", "parameters": versioned + spec["parameters"]}
        },
    }


def _open(tag: str, operation: str, summary: str, responses: Json) -> Json:
    """A GET route that needs no API key."""
    return {"get": {"tags": [tag], "operationId": operation, "summary": summary, "security": [],
                    "responses": responses}}


def _v2_paths() -> Json:
    not_ready = _json("The model (version) exists but is not ready.", "Retry-After")
    found: Json = {
        "/v2": _open("metadata", "serverMetadata", "Server metadata",
                     {"200": _json("Server metadata.", model="ServerMetadata")}),
        "/v2/health/live": _open("health", "serverLive", "Liveness",
                                 {"200": _json("Live.", model="ServerLive"),
                                  "503": _json("Not live.", model="ServerLive")}),
        "/v2/health/ready": _open("health", "serverReady", "Readiness",
                                  {"200": _json("Every model has settled.", model="ServerReady"),
                                   "503": _json("A model is loading or the backend is down.", model="ServerReady")}),
        "/metrics": _open("metrics", "metrics", "Prometheus metrics",
                          {"200": {"description": "Prometheus text exposition format.",
                                   "content": {"text/plain": {"schema": {"type": "string"}}}}}),
    }
    metadata = {"tags": ["metadata"], "summary": "Model metadata", "security": _API_KEY, "parameters": [],
                "responses": {"200": _json("Model metadata.", model="ModelMetadata"), **_target_errors(not_ready)}}
    ready = {"tags": ["metadata"], "summary": "Model readiness", "security": _API_KEY, "parameters": [],
             "responses": {"200": _json("Ready.", model="ModelReady"),
                           **_target_errors(_json("Not ready, and why (error).", model="ModelReady"))}}
    config = {"tags": ["metadata"], "summary": "Model configuration", "security": _API_KEY, "parameters": [],
              "responses": {"200": _json("config.pbtxt as JSON.", model="ModelConfig"), **_target_errors(not_ready)}}
    found.update(_model_routes("", "modelMetadata", "get", metadata))
    found.update(_model_routes("/ready", "modelReady", "get", ready))
    found.update(_model_routes("/config", "modelConfig", "get", config))
    found.update(_model_routes("/infer", "modelInfer", "post", _infer(not_ready)))
    found.update(_model_routes("/generate", "modelGenerate", "post", _generate(not_ready, streaming=False)))
    found.update(_model_routes("/generate_stream", "modelGenerateStream", "post", _generate(not_ready, streaming=True)))
    return found


def _generate(not_ready: Json, *, streaming: bool) -> Json:
    """The generate extension: ``/infer``'s admission and errors, its own JSON in and out."""
    spec = _infer(not_ready)
    version = "X-Model-Version"
    if streaming:
        ok: Json = {"description": "One server-sent event per response (data: GenerateResponse); an error after "
                    "the first one comes as a last event data: Error.",
                    "headers": {name: _ref("headers", name) for name in (version, *_RATE)},
                    "content": {"text/event-stream": {"schema": {"type": "string"}}}}
    else:
        ok = _json("The model's one response.", version, *_RATE, model="GenerateResponse")
    return {
        **spec,
        "summary": "Generate, one event per response (server-sent events)" if streaming else "Generate",
        "parameters": [_ref("parameters", name) for name in ("X-Request-Timeout", "X-Priority")],
        "requestBody": {"required": True,
                        "content": {"application/json": {"schema": _ref("schemas", "GenerateRequest")}}},
        "responses": {**spec["responses"], "200": ok},
    }


def _infer(not_ready: Json) -> Json:
    version = "X-Model-Version"
    ok = _json("Outputs as JSON, or a JSON header followed by binary outputs.", version, *_RATE,
               "Inference-Header-Content-Length", model="InferenceResponse")
    ok["content"]["application/octet-stream"] = {"schema": {"type": "string", "format": "binary"}}
    return {
        "tags": ["inference"],
        "summary": "Inference",
        "security": _API_KEY,
        "parameters": [_ref("parameters", name) for name in
                       ("X-Request-Timeout", "X-Priority", "Inference-Header-Content-Length")],
        "requestBody": {"required": True, "content": {
            "application/json": {"schema": _ref("schemas", "InferenceRequest")},
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        }},
        "responses": {
            "200": ok,
            **_target_errors(not_ready),
            "400": _json("Malformed request, or inputs that do not match the model.", version),
            "413": _json("The body exceeds the gateway's limit."),
            "429": _json("Rate limited.", "Retry-After", *_RATE),
            "500": _json("The model failed on this request.", version, "X-Request-Id"),
            "503": _json("Not ready, overloaded or the backend is unavailable.", "Retry-After", version),
            "504": _json("The request's deadline passed.", version),
        },
    }


def _admin(operation: str, summary: str, ok: str, statuses: tuple[str, ...], *, body: str | None = None,
           parameters: tuple[str, ...] = ("model_name",), optional_body: bool = True) -> Json:
    meanings = {
        "400": "Malformed request.", "404": "Unknown model or version.",
        "409": "The model is busy with another action, or the action contradicts its state.",
        "422": "The version failed a step (loading, warm-up); the routing is unchanged.",
        "503": "The backend is unavailable.",
    }
    responses: Json = {
        "200": _json(summary + ".", model=ok),
        "401": _json("No bearer token.", "WWW-Authenticate", model="AdminError"),
        "403": _json("Wrong token, a read-only token on an action, or the admin API is off.", model="AdminError"),
    }
    responses.update({status: _json(meanings[status], model="AdminError") for status in statuses})
    spec: Json = {"tags": ["admin"], "operationId": operation, "summary": summary, "security": _ADMIN,
                  "parameters": [_ref("parameters", name) for name in parameters], "responses": responses}
    if body is not None:
        content = {"application/json": {"schema": _ref("schemas", body)}}
        spec["requestBody"] = {"required": not optional_body, "content": content}
    return spec


def _admin_paths() -> Json:
    model = "/admin/models/{model_name}"
    version = model + "/versions/{model_version}"
    action = ("400", "404", "409", "422", "503")
    versioned = ("model_name", "model_version")
    return {
        "/admin/whoami": {"get": _admin("adminWhoami", "The caller's role and audit-log name", "AdminCaller", (),
                                        parameters=())},
        "/admin/models": {"get": _admin("adminModels", "Every model's routing and versions", "AdminModels", (),
                                        parameters=())},
        model: {"get": _admin("adminModel", "One model's status", "AdminModel", ("404",))},
        f"{model}/events": {"get": _admin("adminEvents", "The model's audit log", "AdminEvents", ("400", "404"),
                                          parameters=("model_name", "limit"))},
        "/admin/events": {"get": _admin("adminAllEvents", "Every model's audit log: its newest events",
                                        "AdminEvents", ("400",), parameters=("limit",))},
        "/admin/console/models": {"get": _admin("adminConsoleModels", "Every model's status, live figures and last "
                                                "swap in one answer (query: minutes, step)", "AdminReport", ("400",),
                                                parameters=())},
        f"{model}/rollback": {"post": _admin("adminRollback", "Roll back to the previous version", "AdminReport",
                                             action, body="SwitchOptions")},
        f"{model}/traffic": {"put": _admin("adminTraffic", "Set or end a canary split", "AdminReport",
                                           ("400", "404", "409"), body="TrafficPolicy", optional_body=False)},
        f"{model}/shadow": {"put": _admin("adminShadow", "Set or end shadow traffic", "AdminReport",
                                          ("400", "404", "409"), body="ShadowPolicy", optional_body=False)},
        f"{model}/inference-log": {"put": _admin("adminInferenceLog", "Set the model's inference-log share and "
                                                 "redactions", "AdminReport", ("400", "404", "409"),
                                                 body="InferenceLogPolicy", optional_body=False)},
        f"{version}/activate": {"post": _admin("adminActivate", "Make a version the stable one", "AdminReport",
                                               action, body="ActivateOptions", parameters=versioned)},
        f"{version}/load": {"post": _admin("adminLoad", "Load a version (it serves pinned requests only)",
                                           "AdminReport", action, body="LoadOptions", parameters=versioned)},
        f"{version}/unload": {"post": _admin("adminUnload", "Unload a version", "AdminReport", action,
                                             body="UnloadOptions", parameters=versioned)},
        "/admin/repository/scan": {"post": _admin("adminScan", "Rescan the model repository", "AdminReport",
                                                  ("409", "503"), parameters=())},
        f"{model}/live": {"get": _admin("adminLive", "Per-version requests/s, 5xx rate and p50/p99 over the last "
                                        "minutes (query: minutes, step)", "AdminReport", ("400", "404"))},
        f"{version}/compare": {"post": _admin("adminCompare", "Compare a loaded version's outputs with the stable "
                                              "one's; changes nothing", "AdminReport", action, parameters=versioned)},
        f"{model}/tune": {
            "post": _accepted(_admin("adminTuneStart", "Start tuning the model's batching and instances in the "
                                     "background (body: p99_ms, concurrency, duration_s, budget_s, write, ...); the "
                                     "answer's id names the run", "AdminReport", ("400", "404", "409", "503"))),
            "get": _run_query(_admin("adminTuneStatus", "The tuning run's progress and result: the model's current "
                                     "run, or the run of the id given", "AdminReport", ("400", "404", "503"))),
            "delete": _run_query(_admin("adminTuneCancel", "Cancel the running tuning run: its trial in progress "
                                        "ends, every trial is unloaded, nothing is written; answers its final status "
                                        "(404: no run; 409: the run named is not the model's current run, or it has "
                                        "ended, or is writing its winner)", "AdminReport",
                                        ("400", "404", "409", "503"))),
        },
    }


def _run_query(spec: Json) -> Json:
    """A tuning call that may name its run: ``?run=<id>``, the id ``POST .../tune`` answered."""
    spec["parameters"].append({
        "name": "run", "in": "query", "required": False,
        "description": "The tuning run's id, as POST answered it: that run only (without it: the model's current run)",
        "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
    })
    return spec


def _accepted(spec: Json) -> Json:
    """An admin call that answers 202 (started in the background) instead of 200."""
    spec["responses"]["202"] = spec["responses"].pop("200")
    return spec


def paths() -> Json:
    """Every route ``rest.add_routes``, ``admin.add_admin_routes`` and ``add_repository_routes`` serve, by path and
    method."""
    return {**_v2_paths(), **_admin_paths(), **repository_paths(), **statistics_paths(), **shared_memory_paths()}
