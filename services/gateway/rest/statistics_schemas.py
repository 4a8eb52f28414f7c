"""The statistics extension in the OpenAPI document: its answer's models (Triton's JSON, plus the gateway's hop) and
its three routes."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

Count = Annotated[int, Field(ge=0)]
Json = dict[str, Any]


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StatisticDuration(_Closed):
    count: Count
    ns: Count = Field(description="Cumulative nanoseconds.")


class InferStatistics(_Closed):
    success: StatisticDuration
    fail: StatisticDuration
    queue: StatisticDuration
    compute_input: StatisticDuration
    compute_infer: StatisticDuration
    compute_output: StatisticDuration
    cache_hit: StatisticDuration
    cache_miss: StatisticDuration


class InferBatchStatistics(_Closed):
    batch_size: Count
    compute_input: StatisticDuration
    compute_infer: StatisticDuration
    compute_output: StatisticDuration


class ModelStatistics(BaseModel):
    """One loaded version, as Triton reports it (a newer Triton behind the gateway may add fields)."""

    model_config = ConfigDict(extra="allow")
    name: str
    version: str
    last_inference: Count = Field(description="Milliseconds since the epoch of the last executed batch (0: none).")
    inference_count: Count = Field(description="Rows of the successful requests.")
    execution_count: Count = Field(description="Executed batches.")
    inference_stats: InferStatistics
    batch_stats: list[InferBatchStatistics]
    memory_usage: list[dict[str, Any]]
    response_stats: dict[str, Any]


class GatewayStatistics(_Closed):
    """The gateway's own figures of one version (not part of Triton's answer)."""

    name: str
    version: str
    success: StatisticDuration = Field(description="Requests answered, from routing to the answer.")
    fail: StatisticDuration = Field(description="Requests routed to this version that failed.")
    backend: StatisticDuration = Field(description="Of the successful requests: time waiting on the backend.")
    hop: StatisticDuration = Field(description="Of the successful requests: time in the gateway (success - backend).")


class ModelStatisticsResponse(_Closed):
    model_stats: list[ModelStatistics]
    gateway_stats: list[GatewayStatistics]


RESPONSE_MODELS: tuple[type[BaseModel], ...] = (ModelStatisticsResponse,)


def statistics_paths() -> Json:
    """``GET /v2/models[/{model_name}[/versions/{model_version}]]/stats``."""

    def route(operation: str, parameters: tuple[str, ...], errors: Json) -> Json:
        return {"get": {
            "tags": ["metadata"], "operationId": operation, "summary": "Inference statistics (statistics extension)",
            "security": [{}, {"apiKey": []}], "parameters": [_ref("parameters", name) for name in parameters],
            "responses": {"200": _json("Statistics of every ready version asked for.", "ModelStatisticsResponse"),
                          "401": _json("An API key is needed (API keys on, metadata protected) or is not valid."),
                          **errors},
        }}

    unavailable = _json("The backend (Triton) did not answer.")
    unavailable["headers"] = {"Retry-After": _ref("headers", "Retry-After")}
    named = {"400": _json("Malformed version."), "404": _json("Unknown model, or no such ready version."),
             "503": unavailable}
    return {
        "/v2/models/stats": route("modelStatisticsAll", (), {"503": unavailable}),
        "/v2/models/{model_name}/stats": route("modelStatistics", ("model_name",), named),
        "/v2/models/{model_name}/versions/{model_version}/stats": route(
            "modelStatisticsVersion", ("model_name", "model_version"), named
        ),
    }


def _ref(kind: str, name: str) -> Json:
    return {"$ref": f"#/components/{kind}/{name}"}


def _json(description: str, model: str = "Error") -> Json:
    return {"description": description, "content": {"application/json": {"schema": _ref("schemas", model)}}}
