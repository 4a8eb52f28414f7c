"""Triton's own statistics (the statistics extension), read over the backend's control client: the one place their
errors become gateway errors."""

from __future__ import annotations

from typing import Any

import grpc
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from services.gateway.backends.triton.errors import TritonErrors
from services.gateway.errors import GatewayError, no_statistics
from services.modelrepo.control import ModelControlError


async def read_statistics(
    client: Any, errors: TritonErrors, model: str | None, version: int | None, timeout_s: float
) -> list[service_pb2.ModelStatistics]:
    """Triton's ``ModelStatistics`` of ``model`` (``None``: every model it serves) and ``version`` (``None``: every
    ready one), as Triton sent them, in (name, version) order. ``client`` is a ``tritonclient.grpc.aio`` client."""
    try:
        answer = await client.get_inference_statistics(
            model_name=model or "",
            model_version="" if version is None else str(version),
            as_json=False,
            client_timeout=timeout_s,
        )
    except InferenceServerException as exc:
        raise _translated(exc, errors, model, version) from None
    except (grpc.RpcError, OSError) as exc:
        raise errors.unavailable(f"reading Triton's statistics failed: {exc}", public=True) from None
    return sorted(answer.model_stats, key=lambda stats: (stats.name, int(stats.version or 0)))


def _translated(
    exc: InferenceServerException, errors: TritonErrors, model: str | None, version: int | None
) -> GatewayError:
    code = str(exc.status() or "").removeprefix("StatusCode.") or "UNKNOWN"
    message = str(exc.message() or exc)
    # Triton answers INVALID_ARGUMENT "requested model 'm' is not available" (or "requested model version is not
    # available") for a version it does not serve: the gateway's 404 for a version that is not loaded.
    if code == "INVALID_ARGUMENT" and "not available" in message:
        return no_statistics(model or "", version, "Triton serves no ready version of it")
    return errors.control_error(ModelControlError(f"reading Triton's statistics failed: {message}", code))
