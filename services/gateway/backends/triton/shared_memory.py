"""Shared-memory regions in a Triton that sees the host's /dev/shm (``SWITCHYARD_TRITON_SHARED_MEMORY``): the shm
objects of the regions clients register with the gateway are registered in Triton too, whole and under names unique
to this gateway process (replicas share one Triton), and forwarded requests name them instead of carrying the
tensors. Registrations Triton lost (it restarted) are made again on first use. Without the setting the gateway copies
tensors between the regions and its requests, and none of this runs.

Triton maps the objects: one a client shrank after registering it would fault there (SIGBUS kills Triton, as it does
when Triton's own clients do this). Every request that names a region is checked against its object's current size
as it is built, and refused with a 400 naming the region; only a client shrinking its object in the moment between
that check and Triton's copy still reaches Triton's mapping."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from services.gateway.errors import BackendUnavailable, InvalidInput
from services.gateway.settings import Settings
from services.gateway.tensors.regions import written_by_server
from services.gateway.tensors.shared_memory import BYTE_SIZE, OFFSET, REGION, Region, RegionSlice
from services.gateway.tensors.types import InferInput, InferOutput, InferRequest, InferResponse

log = logging.getLogger(__name__)

LOST = "Unable to find shared memory region"
"""Triton's words for a region it does not know (NOT_FOUND)."""
_ABOUT_REQUEST = (
    LOST, "for shared memory region", "shared memory size specified", "using shared memory", "shared_memory_"
)
"""How Triton's errors about a request's regions begin or read; its python backend's own shared memory failing is
another matter (a 500)."""
Infer = Callable[[InferRequest], Awaitable[InferResponse]]
IN_USE = "currently in use"
"""Triton's words when it refuses to unregister a region a request still holds: it lets go of a request's regions
just after answering it, so an unregister right after the answer can come too soon."""
IN_USE_RETRIES_S = (0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
"""The pauses before each further try to unregister a region Triton holds (~2 s in all)."""


class SharedMemoryRefused(InvalidInput):
    """Triton refused a request's shared memory; ``lost``: it no longer knows a region (it restarted)."""

    def __init__(self, message: str, *, lost: bool) -> None:
        super().__init__(message)
        self.lost = lost


def refused(message: str, target: str) -> SharedMemoryRefused | None:
    """Triton's error about a request's shared memory (regions, offsets, sizes), else None."""
    if not any(words in message for words in _ABOUT_REQUEST):
        return None
    return SharedMemoryRefused(
        f"Triton refused the shared memory of the request to {target}: {message}", lost=LOST in message
    )


@dataclass
class _Object:
    """A shm object registered in Triton whole, for every region of it the gateway holds: Triton (before 2.4x)
    cannot register two regions of one key, and maps only offsets on page boundaries."""

    name: str
    key: str
    byte_size: int
    users: int = 0


class TritonSharedMemory:
    """The ``RegionMirror`` of the Triton backend; ``client`` gives its model-control client (None: not connected).
    A region whose object Triton cannot map is copied instead, with a warning: Triton not seeing this host's
    /dev/shm, or the same object registered by another gateway (the Triton bug above)."""

    def __init__(self, settings: Settings, client: Callable[[], Any | None]) -> None:
        self._settings = settings
        self._client = client
        self._objects: dict[str, _Object] = {}
        """By key."""
        self._lock = asyncio.Lock()  # one registration per object, even when clients register its regions at once
        self._prefix = f"switchyard-{uuid.uuid4().hex[:12]}-"
        """Triton-side names are unique to this gateway process: replicas share one Triton."""
        self._serial = 0

    async def register(self, region: Region) -> None:
        async with self._lock:
            found = self._objects.get(region.key)
            if found is None:
                found = await self._register_object(region)
            elif region.offset + region.byte_size > found.byte_size:
                log.warning("shm object %r grew after Triton mapped it: region '%s' is copied", region.key, region.name)
                found = None
            if found is not None:
                found.users += 1
                region.remote_name = found.name

    async def unregister(self, region: Region) -> None:
        async with self._lock:
            found = self._objects.get(region.key)
            if region.remote_name is None or found is None:
                return
            found.users -= 1
            if found.users > 0:
                return
            del self._objects[region.key]
        # Outside the lock: the tries below may take a moment, and the name is this registration's own (a client
        # registering the key again gets a new one).
        for pause in (*IN_USE_RETRIES_S, None):
            client = self._client()
            if client is None:
                return  # gone with the connection; a restarted Triton knows no regions
            try:
                await client.unregister_system_shared_memory(found.name, client_timeout=self._timeout)
                return
            except InferenceServerException as exc:
                if IN_USE not in str(exc) or pause is None:
                    log.warning("Triton kept shared memory region '%s' (%r): %s", found.name, found.key, exc)
                    return
            await asyncio.sleep(pause)

    async def infer(self, call: Infer, request: InferRequest) -> InferResponse:
        """``call(request)``, once more after registering again the objects a restarted Triton lost."""
        try:
            return await call(request)
        except SharedMemoryRefused as exc:
            if not exc.lost:
                raise _named(exc, request) from None
        async with self._lock:
            for key in {region.key for region in _regions(request) if not region.closed}:
                found = self._objects.get(key)
                if found is not None:
                    await self._register_again(found)
        try:
            return await call(request)
        except SharedMemoryRefused as exc:
            raise _named(exc, request) from None

    async def _register_object(self, region: Region) -> _Object | None:
        self._serial += 1
        found = _Object(f"{self._prefix}{self._serial}", region.key, region.object_size)
        try:
            await self._send(found)
        except InferenceServerException as exc:
            if _unreachable(exc):
                raise self._unavailable(f"is unavailable: {exc.message()}") from None
            log.warning(
                "Triton could not map shm object %r (%s): the gateway copies the tensors of region '%s' instead "
                "(SWITCHYARD_TRITON_SHARED_MEMORY=true needs Triton on this host, seeing its /dev/shm)",
                region.key, exc.message(), region.name,
            )
            return None
        self._objects[region.key] = found
        return found

    async def _register_again(self, found: _Object) -> None:
        try:
            await self._send(found)
        except InferenceServerException as exc:
            if "already in manager" not in exc.message():  # another request registered it first
                raise self._unavailable(f"lost shm object {found.key!r}: {exc.message()}") from None
            return
        log.info("registered shm object %r in Triton again (it restarted)", found.key)

    async def _send(self, found: _Object) -> None:
        client = self._client()
        if client is None:
            raise self._unavailable("is not connected")
        await client.register_system_shared_memory(
            found.name, found.key, found.byte_size, offset=0, client_timeout=self._timeout
        )

    @property
    def _timeout(self) -> float:
        return self._settings.triton_control_timeout_s

    def _unavailable(self, what: str) -> BackendUnavailable:
        error = BackendUnavailable(f"Triton at {self._settings.triton_url} {what}")
        error.retry_after_s = 1
        return error


def forward_input(entry: Any, tensor: InferInput) -> bool:
    """Name the input's region in its entry of Triton's request (then it has no raw contents entry, as Triton
    expects)."""
    if tensor.region is None or tensor.region.region.remote_name is None:
        return False
    _name(entry.parameters, tensor.region)
    return True


def forward_outputs(message: service_pb2.ModelInferRequest, request: InferRequest) -> None:
    """Ask for the requested outputs by name, those bound for shared memory with their region."""
    if not request.output_regions:
        return
    for name in request.outputs or ():
        entry = message.outputs.add(name=name)
        target = request.output_regions.get(name)
        # Else Triton answers and the gateway copies; a classified output too (the gateway ranks it first).
        if target is not None and target.region.remote_name is not None and name not in request.classification:
            _name(entry.parameters, target)


def forwarded_output(request: InferRequest, name: str, datatype: str, shape: tuple[int, ...]) -> InferOutput | None:
    """An output Triton wrote into the client's region, read from the gateway's own mapping of it."""
    target = request.output_regions.get(name)
    if target is None or target.region.remote_name is None or name in request.classification:
        return None
    return written_by_server(target, name, datatype, shape)


def _name(parameters: Any, target: RegionSlice) -> None:
    region = target.region
    assert region.remote_name is not None
    region.check(target.offset, target.byte_size)  # Triton's mapping must not reach past the object's end
    parameters[REGION].string_param = region.remote_name
    parameters[OFFSET].int64_param = region.offset + target.offset  # Triton maps the whole object
    parameters[BYTE_SIZE].int64_param = target.byte_size


def _named(error: SharedMemoryRefused, request: InferRequest) -> InvalidInput:
    """The client's names for the regions, not Triton's."""
    message = str(error)
    for region in _regions(request):
        if region.remote_name is not None:
            message = message.replace(f"'{region.remote_name}'", f"'{region.name}' ({region.key!r})")
    return InvalidInput(message)


def _regions(request: InferRequest) -> list[Region]:
    found = [tensor.region.region for tensor in request.inputs if tensor.region is not None]
    return found + [target.region for target in request.output_regions.values()]


def _unreachable(exc: InferenceServerException) -> bool:
    return str(exc.status()) in ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED")
