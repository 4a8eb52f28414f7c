"""Model control of the local Triton from synchronous code (the launcher, test fixtures), through the
shared ``services.modelrepo.control``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import tritonclient.grpc.aio as grpcaio

from services.modelrepo.control import ModelControl, ModelControlError
from services.tritonlocal.errors import TritonLocalError

T = TypeVar("T")
POLL_S = 0.1


def run_control(url: str, action: Callable[[ModelControl], Awaitable[T]]) -> T:
    """Run one model-control action with its own gRPC client and event loop; from a thread of its own when the
    caller already runs a loop (an async test). ``ModelControlError`` becomes ``TritonLocalError``."""

    async def call() -> T:
        client = grpcaio.InferenceServerClient(url)
        try:
            return await action(ModelControl(client, poll_s=POLL_S))
        except ModelControlError as exc:
            raise TritonLocalError(str(exc)) from None
        finally:
            await client.close()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(call())
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(call())).result()
