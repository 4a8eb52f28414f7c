"""Pydantic models of the v2 REST and admin bodies: they only describe the API in the OpenAPI document, the codec
parses requests by hand (the hot path never builds these)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel
from pydantic.json_schema import SkipJsonSchema

Datatype = Literal[
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "BF16", "FP32", "FP64",
    "BYTES",
]
"""The v2 datatypes the gateway decodes."""

Count = Annotated[int, Field(ge=0)]
Dim = Annotated[int, Field(ge=-1)]
Seconds = Annotated[float, Field(ge=0)]
Version = Annotated[str, Field(pattern=r"^[0-9]{1,18}$")]
NonFinite = Literal["NaN", "Infinity", "-Infinity"]
"""JSON has no literals for these: float tensors spell them as strings (as the proto3 JSON mapping does)."""
# Nested lists are how most clients send a tensor (numpy ``tolist()``); flat row-major lists are accepted too.
# Strings are BYTES elements (their UTF-8 bytes), or a float tensor's NonFinite spellings.
TensorData = list[float | bool | NonFinite | str | list[Any]]


class _Open(BaseModel):
    """Parameter objects: the v2 protocol lets clients send keys the server does not know."""

    model_config = ConfigDict(extra="allow")


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _SharedMemory(BaseModel):
    shared_memory_region: str | SkipJsonSchema[None] = Field(
        None, description="A registered system shared-memory region holding the tensor (shared-memory extension)."
    )
    shared_memory_offset: Count | SkipJsonSchema[None] = Field(None, description="Where in the region it starts.")
    shared_memory_byte_size: Count | SkipJsonSchema[None] = Field(None, description="How many bytes it takes.")


class InputParameters(_SharedMemory, _Closed):
    """An input parameter the gateway does not implement is refused (400), never ignored."""

    binary_data_size: Count | SkipJsonSchema[None] = Field(
        None, description="Bytes of this input in the binary section that follows the JSON header (binary framing)."
    )


class RequestInput(_Closed):
    name: str
    shape: list[Count]
    datatype: Datatype
    parameters: InputParameters | SkipJsonSchema[None] = None
    data: TensorData | SkipJsonSchema[None] = Field(
        None, description="Values, flat in row-major order or nested to the shape; absent with binary_data_size."
    )


class OutputParameters(_SharedMemory, _Closed):
    """An output parameter the gateway does not implement is refused (400), never ignored."""

    binary_data: bool | SkipJsonSchema[None] = Field(None, description="Send this output as binary data.")
    classification: Count | SkipJsonSchema[None] = Field(
        None,
        description="Answer the top k classes as BYTES 'score:index[:label]' (classification extension); 0: raw.",
    )


class RequestOutput(_Closed):
    name: str
    parameters: OutputParameters | SkipJsonSchema[None] = None


class RequestParameters(_Open):
    """Other keys: forwarded to the model on the Triton backend, refused (400) on the embedded backend."""

    timeout: Count | SkipJsonSchema[None] = Field(
        None, description="Deadline in microseconds (as in Triton); 0 or absent: the gateway's default."
    )
    priority: Count | SkipJsonSchema[None] = Field(
        None, description="1 is the highest priority; 0 or absent: the gateway's default priority."
    )
    binary_data_output: bool | SkipJsonSchema[None] = Field(
        None, description="Send every output as binary data unless its own parameters say otherwise."
    )
    sequence_id: int | str | SkipJsonSchema[None] = Field(
        None, description="Sequence batching: forwarded to Triton for a model with sequence_batching, else refused."
    )
    sequence_start: bool | SkipJsonSchema[None] = Field(None, description="Sequence batching: the first request.")
    sequence_end: bool | SkipJsonSchema[None] = Field(None, description="Sequence batching: the last request.")


class InferenceRequest(_Closed):
    """A v2 inference request (JSON, or the JSON header of the binary tensor data extension)."""

    id: str | SkipJsonSchema[None] = Field(None, description="Echoed in the response.")
    parameters: RequestParameters | SkipJsonSchema[None] = None
    inputs: list[RequestInput]
    outputs: list[RequestOutput] | SkipJsonSchema[None] = Field(
        None, description="Outputs to return (absent: all of them)."
    )


class ResponseOutputParameters(_Open):
    binary_data_size: Count | SkipJsonSchema[None] = None


class ResponseOutput(_Closed):
    name: str
    datatype: str
    shape: list[Count]
    data: list[float | bool | NonFinite] | SkipJsonSchema[None] = Field(
        None, description="Values, flat in row-major order."
    )
    parameters: ResponseOutputParameters | SkipJsonSchema[None] = None


class InferenceResponse(_Closed):
    model_name: str
    model_version: Version
    id: str | SkipJsonSchema[None] = None
    outputs: list[ResponseOutput]


class GenerateRequest(_Open):
    """The generate extension: a key naming one of the model's inputs holds its value (a scalar, or a list flat or
    nested), shaped to the dims the model declares; any other key is a request parameter, as are those of
    ``parameters``."""

    parameters: RequestParameters | SkipJsonSchema[None] = Field(
        None, description="Request parameters; timeout and priority apply as on /infer."
    )


class GenerateResponse(_Open):
    """One response: these keys, and each output under its own name (a list of its values, or the value itself when
    it holds one; BYTES as strings). On generate_stream each is one server-sent event, ``data: {...}``; an event
    ``data: {"error": "..."}`` ends a stream that failed after it started."""

    model_name: str
    model_version: Version
    id: str | SkipJsonSchema[None] = None


class Error(_Closed):
    """The v2 error shape."""

    error: str


class TensorMetadata(_Closed):
    name: str
    datatype: str
    shape: list[Dim] = Field(description="-1: any size (the batch dimension first when the model batches).")


class ModelMetadata(_Closed):
    name: str
    versions: list[Version]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class ServerMetadata(_Closed):
    name: str
    version: str
    extensions: list[str]
    grpc_port: Annotated[int, Field(ge=1, le=65535)] | SkipJsonSchema[None] = Field(
        None, description="The gateway's gRPC port (absent when gRPC is off); the gateway's own key, not v2's."
    )


class ModelConfig(RootModel[dict[str, Any]]):
    """The model's ``config.pbtxt`` as JSON (protobuf field names)."""


class AdminError(_Closed):
    error: str
    step: str | SkipJsonSchema[None] = Field(None, description="The step a failed version action stopped at.")


class AdminModelSummary(_Open):
    name: str
    ready: bool
    stable: int | None
    loaded: list[int]
    available: list[int]
    problem: str | None


class ModelCacheView(_Closed):
    budget_mb: float
    used_mb: float
    pinned: list[str]


class AdminModels(_Closed):
    models: list[AdminModelSummary]
    cache: ModelCacheView | None = Field(None, description="The model cache (SWITCHYARD_MODEL_CACHE_MB), when on.")


class AdminCaller(_Closed):
    actor: str
    """How the audit log names the caller: ``admin:<id>`` for a keys-file token, ``token:<fingerprint>`` for
    SWITCHYARD_ADMIN_TOKEN."""
    role: Literal["read-only", "operator"]


class LoadedVersion(_Open):
    version: int
    state: Literal["LOADING", "READY", "UNAVAILABLE"]
    leases: int
    on_disk: bool
    problem: str | None


class AdminModel(_Open):
    """Routing, loaded versions, versions on disk, the action running now and the last one."""

    name: str
    platform: str
    ready: bool
    loaded: list[LoadedVersion]
    available: list[int]
    unreleased: list[int] = Field(
        description="Versions on disk the exporter published unreleased: a start with no routing state never makes "
                    "one stable; an activation does."
    )


class AdminEvents(_Closed):
    events: list[dict[str, Any]]


class AdminReport(RootModel[dict[str, Any]]):
    """What a version action did, step by step."""


class SwitchOptions(_Closed):
    keep_previous: bool | SkipJsonSchema[None] = Field(None, description="Keep the old stable version loaded.")
    drain_timeout_s: Seconds | SkipJsonSchema[None] = Field(
        None, description="Longest wait for requests in flight on the old version (up to the gateway's max)."
    )
    compare: bool | SkipJsonSchema[None] = Field(None, description="Compare the new version's outputs first.")


class ReplayCheck(_Closed):
    """Replay logged production requests on the new version before the flip; refused when its answers differ."""

    source: str = Field(description="The inference log the gateway reads: a directory or a redis:// stream URL.")
    limit: Annotated[int, Field(ge=1, le=10_000)] | SkipJsonSchema[None] = Field(
        None, description="The newest N records of the model (default 200)."
    )
    atol: Annotated[float, Field(ge=0)] | SkipJsonSchema[None] = Field(None, description="Absolute tolerance (1e-5).")
    rtol: Annotated[float, Field(ge=0)] | SkipJsonSchema[None] = Field(None, description="Relative tolerance (1e-4).")


class ActivateOptions(SwitchOptions):
    verify_replay: ReplayCheck | SkipJsonSchema[None] = Field(
        None, description="Check the version against logged production requests before the flip."
    )


class InferenceLogPolicy(_Closed):
    """The model's own inference-log share and redactions; ``{}`` goes back to the gateway's settings."""

    percent: Annotated[float, Field(ge=0, le=100)] | None = Field(
        None, description="Percent of the model's requests logged (null: SWITCHYARD_INFERENCE_LOG_SAMPLE)."
    )
    redact: dict[str, Literal["drop", "hash"]] | SkipJsonSchema[None] = Field(
        None, description="Inputs never logged as sent: dropped, or kept as a SHA-256 of their values."
    )


class UnloadOptions(_Closed):
    drain_timeout_s: Seconds | SkipJsonSchema[None] = None


class LoadOptions(_Closed):
    """No options yet: an empty body or ``{}``."""


class RollbackBounds(_Closed):
    max_error_rate: Annotated[float, Field(ge=0, le=1)] | SkipJsonSchema[None] = None
    max_p99_ratio: Annotated[float, Field(ge=1, le=1000)] | SkipJsonSchema[None] = None
    window_s: Annotated[float, Field(ge=1, le=3600)] | SkipJsonSchema[None] = None
    min_requests: Annotated[int, Field(ge=1, le=1_000_000)] | SkipJsonSchema[None] = None


class TrafficPolicy(_Closed):
    """A canary split; ``canary: null`` ends it."""

    canary: Annotated[int, Field(ge=0)] | None = Field(None, description="The canary version.")
    weight: Annotated[float, Field(ge=0, le=100)] | SkipJsonSchema[None] = Field(
        None, description="Percent of unversioned requests sent to the canary (required with one)."
    )
    sticky_header: Annotated[str, Field(pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")] | SkipJsonSchema[None] = None
    rollback: RollbackBounds | SkipJsonSchema[None] = None
    promote_after_s: Annotated[float, Field(ge=1, le=30 * 86400)] | SkipJsonSchema[None] = None


class ShadowPolicy(_Closed):
    """Shadow traffic; ``version: null`` ends it."""

    version: Annotated[int, Field(ge=0)] | None = Field(None, description="The shadow version.")
    percent: Annotated[float, Field(ge=0, le=100)] | SkipJsonSchema[None] = Field(
        None, description="Percent of unversioned requests also run on it (required with one; 0 stops it)."
    )
    sample: Annotated[float, Field(ge=0, le=1)] | SkipJsonSchema[None] = Field(
        None, deprecated=True, description="Deprecated: the same as a fraction (0-1); give percent instead."
    )


REQUEST_MODELS: tuple[type[BaseModel], ...] = (
    InferenceRequest,
    GenerateRequest,
    SwitchOptions,
    ActivateOptions,
    UnloadOptions,
    LoadOptions,
    TrafficPolicy,
    ShadowPolicy,
    InferenceLogPolicy,
)
RESPONSE_MODELS: tuple[type[BaseModel], ...] = (
    InferenceResponse,
    GenerateResponse,
    Error,
    ModelMetadata,
    ServerMetadata,
    ModelConfig,
    AdminError,
    AdminModels,
    AdminCaller,
    AdminModel,
    AdminEvents,
    AdminReport,
)
