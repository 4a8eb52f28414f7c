"""The health answers' bodies in the OpenAPI document (KServe v2's ``$live_server_response``,
``$ready_server_response`` and ``$ready_model_response``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServerLive(_Closed):
    live: bool


class ServerReady(_Closed):
    ready: bool


class ModelReady(_Closed):
    name: str
    ready: bool
    error: str | SkipJsonSchema[None] = Field(default=None, description="Why the model is not ready (ready false).")


RESPONSE_MODELS: tuple[type[BaseModel], ...] = (ServerLive, ServerReady, ModelReady)
