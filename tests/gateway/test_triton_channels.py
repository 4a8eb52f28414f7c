"""The gateway's gRPC channels to Triton keep within Triton's default ping policy (its server flags
``--grpc-http2-min-recv-ping-interval-without-data=300000``, ``--grpc-keepalive-permit-without-calls=false``, two
strikes): pinging more often got the connection closed with GOAWAY "too_many_pings" after ~30 s, failing a long
model load that was in flight on it (seen against the local Triton 2.51)."""

from __future__ import annotations

from pathlib import Path

from services.gateway.backends.triton.channels import channel_options
from services.gateway.settings import Settings

TRITON_MIN_PING_INTERVAL_MS = 300_000


def test_channels_ping_no_more_often_than_triton_allows_and_never_without_a_call(tmp_path: Path) -> None:
    options = dict(channel_options(Settings(repository=tmp_path, backend="triton")))
    assert options["grpc.keepalive_time_ms"] > TRITON_MIN_PING_INTERVAL_MS
    assert options["grpc.keepalive_permit_without_calls"] == 0
