"""The gRPC connections to Triton: a ``tritonclient`` client for model control and the health probe, and a
bare channel with the generated stub for inference. With TLS to Triton, ``TlsWatch`` tells the backend when the
certificate, key or CA files changed: it then opens new channels and ``retire``s the old ones once their calls are
over (a renewed client certificate takes effect without a restart; one outside its validity dates is refused, and one
refused only because it is not valid yet is tried again at its notBefore)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

import grpc
import tritonclient.grpc.aio as triton
from tritonclient.grpc import service_pb2_grpc

from services.gateway.security import FileCertificates, Seen, TlsError, triton_tls, triton_tls_files
from services.gateway.settings import Settings


@dataclass
class TritonChannels:
    client: Any
    """``tritonclient.grpc.aio.InferenceServerClient``: model control and the health probe."""
    channel: grpc.aio.Channel
    infer: Any
    """The generated ``ModelInfer`` stub method on ``channel``."""
    stream: Any
    """The generated ``ModelStreamInfer`` stub method on ``channel`` (decoupled models, ``streams.py``)."""
    certificates: tuple[FileCertificates, ...] = ()
    """The dates of the client certificate and the CAs the channels were opened with (TLS to Triton)."""

    async def close(self) -> None:
        await self.client.close()
        await self.channel.close()


def open_channels(settings: Settings, *, renewal: bool = False) -> TritonChannels:
    """Inference goes straight through the generated stub on its own channel: no InferInput/InferResult
    wrappers, no extra copies, and the probe's calls never queue behind a burst of inference on the same
    HTTP/2 connection. ``renewal``: new files replace the ones in use (``security.triton_tls``)."""
    options = channel_options(settings)
    # With SWITCHYARD_TRITON_TLS both channels share one set of credentials, read once (files are checked at
    # startup; a new Triton certificate signed by the same CA needs no change here).
    tls = triton_tls(settings, renewal=renewal)
    credentials = tls.credentials if tls is not None else None
    client = triton.InferenceServerClient(settings.triton_url, channel_args=options, creds=credentials)
    if credentials is None:
        channel = grpc.aio.insecure_channel(settings.triton_url, options=options)
    else:
        channel = grpc.aio.secure_channel(settings.triton_url, credentials, options=options)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    return TritonChannels(client, channel, stub.ModelInfer, stub.ModelStreamInfer,
                          tls.certificates if tls is not None else ())


class TlsWatch:
    """The TLS files of the channels to Triton (``SWITCHYARD_TRITON_TLS_*``), looked at by the health probe."""

    def __init__(self, settings: Settings) -> None:
        self._files = triton_tls_files(settings)
        self._seen = Seen(self._read())

    def _read(self) -> tuple[tuple[int, int, int] | None, ...]:
        return tuple(file.stamp() for file in self._files)

    @property
    def cert_path(self) -> str:
        """The file a reload is named by in the log: the client certificate, else the CA."""
        return str(next((f.path for f in self._files if f.setting == "triton_tls_cert_file"), self._files[0].path))

    def changed(self) -> bool:
        """Whether a file was rewritten or replaced (a renewed certificate, a Kubernetes secret's symlink swap) since
        the last call; each change is told once, so a broken one is reported once, not every probe."""
        if not self._files:
            return False
        stamps = self._read()
        if not self._seen.due(stamps):
            return False
        self._seen.saw(stamps)
        return True

    def refused(self, error: TlsError) -> str:
        """The files that changed last do not load: a certificate not valid yet is tried again at its notBefore
        (said in the returned note for the log)."""
        self._seen.saw(self._seen.stamps, error)
        return self._seen.retry_note()


async def retire(channels: TritonChannels, *, calls_s: float, control_s: float) -> None:
    """Close channels that new ones replaced, once their calls are over: inference calls and decoupled streams within
    ``calls_s`` (gRPC waits for them), model control after ``control_s`` (a load may still run on the old client).
    Cancelled (the backend closes), it closes them at once."""
    try:
        await channels.channel.close(calls_s)
        await asyncio.sleep(control_s)
    finally:
        with contextlib.suppress(Exception):
            await channels.close()


def channel_options(settings: Settings) -> list[tuple[str, Any]]:
    backoff_ms = int(settings.triton_reconnect_backoff_s * 1000)
    return [
        # gRPC's largest, not the client's request limit: a request within it may grow on the way (a JSON body's
        # BYTES gain a 4-byte length per element) and a model's outputs may be larger than its inputs.
        ("grpc.max_send_message_length", MESSAGE_LIMIT),
        ("grpc.max_receive_message_length", MESSAGE_LIMIT),
        # Come back within a fraction of a second of Triton's return, not gRPC's default minutes.
        ("grpc.initial_reconnect_backoff_ms", min(100, backoff_ms)),
        ("grpc.min_reconnect_backoff_ms", min(100, backoff_ms)),
        ("grpc.max_reconnect_backoff_ms", backoff_ms),
        # Pings within Triton's default policy: it allows one ping per 5 minutes without data and none without a
        # call in flight, and after two strikes answers GOAWAY "too_many_pings", which fails the calls on the
        # connection (a model load that runs past half a minute, with the 10 s pings this once sent). A dead Triton
        # is found by the health probe and by each call's deadline, not by pings.
        ("grpc.keepalive_time_ms", KEEPALIVE_MS),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.http2.max_pings_without_data", 0),
    ]


MESSAGE_LIMIT = 2**31 - 1
"""The largest message gRPC's int32 options allow (Triton's own limit)."""
KEEPALIVE_MS = 360_000
"""Above Triton's ``--grpc-http2-min-recv-ping-interval-without-data`` default (300 000 ms)."""
