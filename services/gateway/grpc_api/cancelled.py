"""How a request that gRPC cancelled under the gateway is counted: a unary call or a stream cancelled by its client,
or ended by its deadline. Without this such requests would vanish from ``switchyard_requests_total``."""

from __future__ import annotations

from typing import Any

import grpc

from services.gateway.dataplane import DataPlane
from services.gateway.errors import ClientGone, DeadlineExceeded, GatewayError

PROTOCOL = "grpc"
DEADLINE_SLACK_S = 0.05
"""A cancel this close to the call's deadline is the deadline's (see ``count_cancelled``)."""


def count_cancelled(
    dataplane: DataPlane, context: grpc.aio.ServicerContext[Any, Any], model: str, version: Any, tenant: str, *,
    stopping: bool,
) -> None:
    """Count a request whose call gRPC cancelled: its deadline passed (504), or its client cancelled it (499).
    ``stopping``: the gateway is shutting down, and a call still running past the grace period is cancelled by the
    server, which counts as neither. (``context.cancelled()`` cannot tell: it is still False when the handler sees
    the cancellation.)

    gRPC cancels the call when its deadline passes, and that can come before the gateway's own timer for the same
    instant. The client's clock started earlier than the server's (by the call's way in), so its cancel may arrive a
    little before the server's deadline: within ``DEADLINE_SLACK_S`` of it, it counts as the deadline refusal it is;
    a cancel earlier than that is the client's own."""
    remaining = context.time_remaining()
    if remaining is not None and remaining <= DEADLINE_SLACK_S:
        error: GatewayError = DeadlineExceeded(f"request to model '{model}': its deadline passed")
    elif not stopping:
        error = ClientGone("the client cancelled its call, or closed its stream, before the answer")
    else:
        return
    dataplane.record_error(model, version, PROTOCOL, error, tenant)
