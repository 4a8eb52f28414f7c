"""How the inference service is added to the grpc.aio server: through its generic handler only.

grpc.aio keeps one waiting task per "registered" method and waits on all of them again for every call it accepts;
the generated code registers all 21 methods of the inference service that way as well as generically."""

from __future__ import annotations

import asyncio

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from services.gateway.grpc_api.server import GenericHandlersOnly


class _Live(service_pb2_grpc.GRPCInferenceServiceServicer):
    async def ServerLive(self, request: object, context: object) -> service_pb2.ServerLiveResponse:
        return service_pb2.ServerLiveResponse(live=True)


async def _tasks_added_by_a_server(target_of: type[GenericHandlersOnly] | None) -> tuple[int, bool]:
    """Tasks the started server keeps, and ServerLive's answer."""
    before = len(asyncio.all_tasks())
    server = grpc.aio.server()
    target = server if target_of is None else target_of(server)
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(_Live(), target)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            live = (await stub.ServerLive(service_pb2.ServerLiveRequest())).live
        # Counted once the server has answered a call and its tasks have settled: on a loaded machine not all of
        # them exist yet when start() returns.
        return await _settled_task_count() - before, live
    finally:
        await server.stop(None)


async def _settled_task_count() -> int:
    """The number of tasks once it stayed the same for 50 ms (at most 2 s of trying)."""
    count = len(asyncio.all_tasks())
    for _ in range(40):
        await asyncio.sleep(0.05)
        now = len(asyncio.all_tasks())
        if now == count:
            return now
        count = now
    return count


async def test_grpc_server_keeps_one_waiting_call_when_the_service_is_added_through_generic_handlers() -> None:
    added, live = await _tasks_added_by_a_server(GenericHandlersOnly)
    assert live  # the servicer's own method answered: found through the generic handler
    registered, _ = await _tasks_added_by_a_server(None)
    # The server's loop and its one request call, against one more per method when they are registered.
    assert added <= 3, f"the server keeps {added} tasks"
    assert registered >= added + 20, f"registered methods: {registered} tasks, generic only: {added}"
