"""The shared-memory extension over REST: ``/v2/systemsharedmemory/...`` on the registry, ``/v2/cudasharedmemory/...``
answered with a clear refusal (status lists nothing and unregister succeeds, so clients that clean up at startup
work), and the routes' OpenAPI description."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from services.gateway.dataplane import DataPlane
from services.gateway.errors import InvalidInput
from services.gateway.rest.app import Handler
from services.gateway.rest.body import read_json_object
from services.gateway.rest.responses import JSONBytesResponse
from services.gateway.tensors.shared_memory import CUDA_UNSUPPORTED, Region

SYSTEM = "/v2/systemsharedmemory"
CUDA = "/v2/cudasharedmemory"
_REGION = "/region/{region_name}"


class SharedMemoryEndpoints:
    """Registration calls need the API key when the gateway has API keys: each tenant sees only its own regions."""

    def __init__(self, dataplane: DataPlane) -> None:
        self._regions = dataplane.regions
        self._shaper = dataplane.shaper

    async def system_status(self, request: Request) -> Response:
        regions = self._regions.status(self._tenant(request), request.path_params.get("region_name"))
        return JSONBytesResponse([_status(region) for region in regions])

    async def system_register(self, request: Request) -> Response:
        tenant = self._tenant(request)
        body = await read_json_object(request, self._shaper.max_message_bytes, what="the register body")
        key, offset, byte_size = _register_body(body)
        await self._regions.register(tenant, request.path_params["region_name"], key, offset, byte_size)
        return Response(status_code=200)

    async def system_unregister(self, request: Request) -> Response:
        await self._regions.unregister(self._tenant(request), request.path_params.get("region_name"))
        return Response(status_code=200)

    async def cuda_status(self, request: Request) -> Response:
        if "region_name" in request.path_params:  # no CUDA region can exist here
            raise InvalidInput(CUDA_UNSUPPORTED)
        return JSONBytesResponse([])

    async def cuda_register(self, request: Request) -> Response:
        raise InvalidInput(CUDA_UNSUPPORTED)

    async def cuda_unregister(self, request: Request) -> Response:
        return Response(status_code=200)  # nothing is registered

    def _tenant(self, request: Request) -> str:
        return self._shaper.authenticate(request.headers.get("x-api-key"))


def shared_memory_routes(endpoints: SharedMemoryEndpoints) -> list[tuple[str, Handler, str]]:
    return [
        (f"{SYSTEM}/status", endpoints.system_status, "GET"),
        (f"{SYSTEM}{_REGION}/status", endpoints.system_status, "GET"),
        (f"{SYSTEM}{_REGION}/register", endpoints.system_register, "POST"),
        (f"{SYSTEM}/unregister", endpoints.system_unregister, "POST"),
        (f"{SYSTEM}{_REGION}/unregister", endpoints.system_unregister, "POST"),
        (f"{CUDA}/status", endpoints.cuda_status, "GET"),
        (f"{CUDA}{_REGION}/status", endpoints.cuda_status, "GET"),
        (f"{CUDA}{_REGION}/register", endpoints.cuda_register, "POST"),
        (f"{CUDA}/unregister", endpoints.cuda_unregister, "POST"),
        (f"{CUDA}{_REGION}/unregister", endpoints.cuda_unregister, "POST"),
    ]


def _register_body(parsed: dict[str, Any]) -> tuple[str, int, int]:
    """``{"key": "/name", "offset": 0, "byte_size": 64}`` (offset optional, 0)."""
    key = parsed.get("key")
    if not isinstance(key, str):
        raise InvalidInput("register body needs 'key', the shm object's name as a string")
    numbers = {"offset": parsed.get("offset", 0), "byte_size": parsed.get("byte_size")}
    for field, value in numbers.items():
        if type(value) is not int or value < 0:  # bool is an int subclass
            raise InvalidInput(f"register body needs '{field}' as a non-negative integer, got {str(value)[:40]}")
    return key, numbers["offset"], numbers["byte_size"]


def _status(region: Region) -> dict[str, Any]:
    return {"name": region.name, "key": region.key, "offset": region.offset, "byte_size": region.byte_size}


def shared_memory_paths() -> dict[str, Any]:
    """The routes above in the OpenAPI document."""
    error = {"$ref": "#/components/schemas/Error"}
    api_key: list[dict[str, list[str]]] = [{}, {"apiKey": []}]

    def answer(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"description": description, "content": {"application/json": {"schema": schema or error}}}

    def operation(operation_id: str, summary: str, ok: dict[str, Any], **errors: str) -> dict[str, Any]:
        responses = {"200": ok, **{code.removeprefix("s"): answer(text) for code, text in errors.items()}}
        return {"tags": ["shared memory"], "operationId": operation_id, "summary": summary, "security": api_key,
                "responses": responses}

    status_item = {"type": "object", "required": ["name", "key", "offset", "byte_size"], "properties": {
        "name": {"type": "string"}, "key": {"type": "string"},
        "offset": {"type": "integer", "minimum": 0}, "byte_size": {"type": "integer", "minimum": 1}}}
    listed = answer("The registered regions.", {"type": "array", "items": status_item})
    cuda_listed = answer("Always empty: CUDA shared memory is not supported.", {"type": "array", "maxItems": 0})
    body = {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "required": ["key", "byte_size"], "properties": {
            "key": {"type": "string"}, "offset": {"type": "integer", "minimum": 0},
            "byte_size": {"type": "integer", "minimum": 1}}}}}}
    done = {"description": "Done."}
    region = [{"name": "region_name", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}]
    unauthorized = "An API key is needed (API keys on) or is not valid."
    refused = "Malformed, refused (the extension is off, limits, a name in use, a key or size that does not fit)."
    paths: dict[str, Any] = {
        f"{SYSTEM}/status": {"get": operation("systemSharedMemoryStatus", "Every region", listed, s401=unauthorized)},
        f"{SYSTEM}{_REGION}/status": {"get": operation(
            "systemSharedMemoryRegionStatus", "One region", listed, s401=unauthorized, s404="No such region.")},
        f"{SYSTEM}{_REGION}/register": {"post": {**operation(
            "systemSharedMemoryRegister", "Register a region of a /dev/shm object", done, s400=refused,
            s401=unauthorized, s413="The body is too large.", s503="Triton could not register it too (its "
            "backend, SWITCHYARD_TRITON_SHARED_MEMORY)."), "requestBody": body}},
        f"{SYSTEM}/unregister": {"post": operation("systemSharedMemoryUnregisterAll", "Unregister every region",
                                                   done, s401=unauthorized)},
        f"{SYSTEM}{_REGION}/unregister": {"post": operation(
            "systemSharedMemoryUnregister", "Unregister a region (an unknown one is no error)", done,
            s401=unauthorized)},
        f"{CUDA}/status": {"get": operation("cudaSharedMemoryStatus", "Every CUDA region", cuda_listed)},
        f"{CUDA}{_REGION}/status": {"get": operation(
            "cudaSharedMemoryRegionStatus", "One CUDA region", cuda_listed, s400=CUDA_UNSUPPORTED)},
        f"{CUDA}{_REGION}/register": {"post": operation(
            "cudaSharedMemoryRegister", "Register a CUDA region", done, s400=CUDA_UNSUPPORTED)},
        f"{CUDA}/unregister": {"post": operation("cudaSharedMemoryUnregisterAll", "Unregister every CUDA region",
                                                 done)},
        f"{CUDA}{_REGION}/unregister": {"post": operation("cudaSharedMemoryUnregister", "Unregister a CUDA region",
                                                          done)},
    }
    for path, item in paths.items():
        if _REGION in path:
            for spec in item.values():
                spec["parameters"] = region
    return paths
