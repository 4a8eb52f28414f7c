"""The inference log's other sinks through a real gateway: a Redis stream (a real ``redis-server``) gets a record
per request; a sink that stalls (a server that takes connections and never answers) costs the requests nothing:
the records are dropped and counted, the answers keep their latency, the gateway's memory stays flat. A model's
own share (the admin API's ``inference-log`` policy) turns its logging off and on for every replica alike."""

from __future__ import annotations

import json
import os
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis
import tritonclient.http as httpclient

from examples import models
from services.gateway.settings import Settings
from tests.gateway_harness import running_gateway
from tests.redis_server import redis_server

TOKEN = "inference-log-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def resident_mib() -> float:
    """This process's resident memory now (the gateway runs in it, on its own thread)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def send(client: httpclient.InferenceServerClient, count: int, seed: int = 0) -> list[float]:
    """``count`` binary requests to mlp, one after another; each one's latency in seconds."""
    latencies = []
    for index in range(count):
        tensor = httpclient.InferInput("features", [1, 32], "FP32")
        tensor.set_data_from_numpy(models.mlp_inputs(1, seed=seed + index).numpy(), binary_data=True)
        began = time.perf_counter()
        client.infer("mlp", [tensor])
        latencies.append(time.perf_counter() - began)
    return latencies


@pytest.mark.slow
def test_redis_stream_gets_a_record_of_every_request(example_repository: Path, tmp_path: Path) -> None:
    with redis_server(tmp_path / "redis") as server:
        url = f"{server.url}?stream=switchyard:log&maxlen=100000"
        settings = Settings(repository=example_repository, port=0, grpc_port=None, inference_log=url)
        with running_gateway(settings) as gateway:
            send(httpclient.InferenceServerClient(gateway.http_url), 1000)
            client = redis.Redis.from_url(server.url)
            deadline = time.monotonic() + 20
            while client.xlen("switchyard:log") < 1000 and time.monotonic() < deadline:
                time.sleep(0.05)
            entries = client.xrange("switchyard:log")
    assert len(entries) == 1000
    records = [json.loads(fields[b"record"]) for _, fields in entries]
    assert {record["model"] for record in records} == {"mlp"}
    first = records[0]["request"]["inputs"][0]
    np.testing.assert_allclose(first["data"], models.mlp_inputs(1, seed=0).numpy().ravel(), rtol=1e-6)


class StalledSink:
    """An HTTP endpoint that takes connections and never answers: the sink's writes hang until their timeout."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}/events"

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            self._held.append(connection)

    def close(self) -> None:
        self._listener.close()
        for connection in self._held:
            connection.close()


@pytest.fixture
def stalled() -> Iterator[StalledSink]:
    sink = StalledSink()
    yield sink
    sink.close()


@pytest.mark.slow
def test_stalled_sink_drops_and_counts_records_while_requests_keep_their_latency_and_memory_stays_flat(
    example_repository: Path, stalled: StalledSink
) -> None:
    settings = Settings(
        repository=example_repository, port=0, grpc_port=None, admin_token=TOKEN, inference_log=stalled.url,
        inference_log_queue=64, inference_log_timeout_s=1.0,
    )
    with running_gateway(settings) as gateway:
        client = httpclient.InferenceServerClient(gateway.http_url)
        policy = f"http://{gateway.http_url}/admin/models/mlp/inference-log"
        send(client, 200)  # warm: the queue is full from here on
        rss_before = resident_mib()
        logged, unlogged = [], []
        for round_ in range(3):  # alternating, so that both sides see the same neighbours on a shared machine
            httpx.put(policy, headers=ADMIN, json={"percent": 0}).raise_for_status()
            unlogged += send(client, 300, seed=round_ * 1000)
            httpx.put(policy, headers=ADMIN, json={}).raise_for_status()  # back to the gateway's 100 %
            logged += send(client, 300, seed=round_ * 1000)
        rss_growth_mib = resident_mib() - rss_before
        dropped = gateway.metric("switchyard_inference_log_dropped_total", reason="queue_full")
        written = gateway.metric("switchyard_inference_log_records_total")
    # Every logged request beyond the queue's 64 (and the batch the writer holds) was dropped, none written.
    assert dropped >= 200 + 900 - 64 - 256
    assert written == 0
    ratio = statistics.median(logged) / statistics.median(unlogged)
    print(f"median latency with the stalled sink / without logging: {ratio:.2f}; RSS growth {rss_growth_mib:.1f} MiB")
    assert ratio < 2.0  # a request that waited for the sink would wait for its 1 s timeout
    assert rss_growth_mib < 64
