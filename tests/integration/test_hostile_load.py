"""Hostile load on a real gateway process: invented names must not grow metrics or memory, a 1 GiB chunked body
is refused early, and 3x overload is shed fast while accepted requests keep their latency. Figures are printed
(``pytest -s``) and named in every assertion message."""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway_process import GatewayProcess, gateway_process
from tests.http_load import RawHttpPool
from tests.shaping_models import shaping_repository
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
TOKEN = "hostile-load-admin-token"
MIB = 1024 * 1024


def rss_kib(gateway: GatewayProcess, field: str = "VmRSS") -> int:
    assert gateway.process is not None
    for line in Path(f"/proc/{gateway.process.pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{field} missing from /proc status")


def open_fds(gateway: GatewayProcess) -> int:
    assert gateway.process is not None
    return len(list(Path(f"/proc/{gateway.process.pid}/fd").iterdir()))


def series(gateway: GatewayProcess) -> int:
    text = httpx.get(f"http://{gateway.http_url}/metrics").text
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


@pytest.fixture(scope="module")
def plain(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    work = tmp_path_factory.mktemp("hostile")
    with gateway_process(repository, work, token=TOKEN, max_body_bytes=str(16 * MIB)) as gateway:
        yield gateway


async def _garbage(gateway: GatewayProcess, start: int, count: int) -> dict[int, int]:
    """``count`` requests to names and versions nobody serves; answers by status."""
    body = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 32], "data": [0.0] * 32}]}
    statuses: dict[int, int] = {}
    paths = []
    for i in range(start, start + count):
        kind = i % 4
        paths.append(
            f"/v2/models/made-up-{i}/infer"
            if kind == 0
            else f"/v2/models/mlp/versions/{1000 + i}/infer"
            if kind == 1
            else f"/v2/models/made-up-{i}/versions/{i}/ready"
            if kind == 2
            else f"/v2/models/mlp/versions/0{i}/infer"
        )

    async with httpx.AsyncClient(base_url=f"http://{gateway.http_url}") as client:

        async def worker(share: list[str]) -> None:
            for path in share:
                response = await (client.get(path) if path.endswith("/ready") else client.post(path, json=body))
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

        await asyncio.gather(*(worker(paths[w::8]) for w in range(8)))
    return statuses


def test_invented_models_and_versions_leave_metrics_and_memory_flat(plain: GatewayProcess) -> None:
    asyncio.run(_garbage(plain, 0, 1000))  # every kind of label the garbage can reach exists from here on
    series_before, rss_before = series(plain), rss_kib(plain)
    started = time.monotonic()
    # 4,000 names nobody serves: were each to leave a series (or a cache entry) behind, thousands would show.
    statuses = asyncio.run(_garbage(plain, 1000, 4_000))
    seconds = time.monotonic() - started
    series_after, rss_after = series(plain), rss_kib(plain)
    figures = (
        f"4,000 invented names in {seconds:.1f} s, answers {statuses}; metric samples {series_before} -> "
        f"{series_after}; RSS {rss_before / 1024:.1f} -> {rss_after / 1024:.1f} MiB"
    )
    print(figures)
    assert set(statuses) <= {400, 404}, figures
    assert series_after == series_before, figures
    assert rss_after - rss_before < 8 * 1024, figures


def test_chunked_gigabyte_is_refused_with_memory_under_twice_the_limit(plain: GatewayProcess) -> None:
    peak_before = rss_kib(plain, "VmHWM")
    rss_before = rss_kib(plain)
    chunk = b"0" * MIB
    sent = 0
    started = time.monotonic()
    answer = b""
    with socket.create_connection(("127.0.0.1", plain.http_port), timeout=30) as connection:
        connection.sendall(
            b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: gateway\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Type: application/json\r\n\r\n"
        )
        connection.setblocking(False)
        frame = b"%x\r\n" % len(chunk) + chunk + b"\r\n"
        try:
            while sent < 1024 * MIB:
                try:
                    answer += connection.recv(65536)
                    if answer:
                        break
                except BlockingIOError:
                    pass
                connection.setblocking(True)
                connection.sendall(frame)
                connection.setblocking(False)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        connection.setblocking(True)
        connection.settimeout(10)
        try:
            while b"\r\n\r\n" not in answer:
                data = connection.recv(65536)
                if not data:
                    break
                answer += data
        except (ConnectionResetError, TimeoutError):
            pass
    seconds = time.monotonic() - started
    peak_growth = (rss_kib(plain, "VmHWM") - max(peak_before, rss_before)) / 1024
    figures = (
        f"refused after {sent / MIB:.0f} MiB sent in {seconds:.2f} s; answer {answer[:12]!r}; "
        f"peak RSS growth {max(peak_growth, 0):.1f} MiB (limit 16 MiB)"
    )
    print(figures)
    assert answer.startswith(b"HTTP/1.1 413"), figures
    assert sent < 256 * MIB, figures
    assert peak_growth < 32, figures


@pytest.fixture(scope="module")
def heavy_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    work = tmp_path_factory.mktemp("overload")
    repository = shaping_repository(work / "repository")
    settings = {"max_concurrency": "1", "max_queue": "0", "intra_op_threads": "1"}
    with gateway_process(repository, work, token=TOKEN, **settings) as gateway:
        yield gateway


ITERATIONS = 2400  # about 10 ms of one core per request


def _busy_request() -> bytes:
    body = json.dumps(
        {
            "inputs": [
                {"name": "x", "datatype": "FP32", "shape": [1, 256], "data": [0.5] * 256},
                {"name": "iterations", "datatype": "INT64", "shape": [1, 1], "data": [ITERATIONS]},
            ]
        }
    ).encode()
    return RawHttpPool.post("/v2/models/busy/infer", body)


def _p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) >= 2 else values[0]


async def _unloaded(gateway: GatewayProcess, count: int) -> list[float]:
    pool = RawHttpPool("127.0.0.1", gateway.http_port)
    request = _busy_request()
    latencies = []
    for _ in range(count):
        status, seconds = await pool.send(request)
        assert status == 200
        latencies.append(seconds)
    await pool.close()
    return latencies


async def _open_loop(gateway: GatewayProcess, rate: float, seconds: float) -> list[tuple[int, float]]:
    """Requests sent on a fixed schedule whatever the answers (an overload does not slow its clients down)."""
    pool = RawHttpPool("127.0.0.1", gateway.http_port)
    request = _busy_request()
    tasks = []
    begin = time.perf_counter()
    for n in range(int(rate * seconds)):
        delay = begin + n / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(pool.send(request)))
    answers = await asyncio.gather(*tasks)
    await pool.close()
    return answers


def test_overload_sheds_fast_and_keeps_accepted_latency(heavy_gateway: GatewayProcess) -> None:
    latencies = asyncio.run(_unloaded(heavy_gateway, 60))[10:]
    unloaded_p99 = _p99(latencies)
    sustained = 1 / statistics.median(latencies)
    rss_before = rss_kib(heavy_gateway)
    answers = asyncio.run(_open_loop(heavy_gateway, 3 * sustained, 8.0))
    rss_after = rss_kib(heavy_gateway)
    accepted = [seconds for status, seconds in answers if status == 200]
    refused = [seconds for status, seconds in answers if status == 503]
    others = sorted({status for status, _ in answers} - {200, 503})
    figures = (
        f"unloaded p99 {unloaded_p99 * 1e3:.1f} ms ({sustained:.0f} req/s sustained); offered "
        f"{3 * sustained:.0f} req/s for 8 s: {len(accepted)} accepted (p99 {_p99(accepted) * 1e3:.1f} ms), "
        f"{len(refused)} refused (p99 {_p99(refused) * 1e3:.1f} ms), other statuses {others}; "
        f"RSS {rss_before / 1024:.1f} -> {rss_after / 1024:.1f} MiB"
    )
    print(figures)
    assert not others, figures
    assert len(refused) > len(answers) / 3, figures
    # Margins for a loaded two-core machine (the suite's other worker may run a multi-process gateway under load
    # meanwhile: CI once saw 4.6x and 97 ms): about 1.5x and 4 ms when idle. What they catch is queueing: behind a 3x
    # overload for 8 s, a queued request waits for seconds, an order of magnitude past either bound.
    assert _p99(accepted) < 10 * unloaded_p99, figures
    assert _p99(refused) < 0.25, figures
    assert rss_after - rss_before < 32 * 1024, figures


def test_disconnects_mid_body_and_model_failures_log_one_line_each_at_most(heavy_gateway: GatewayProcess) -> None:
    log_before = heavy_gateway.log.read_text()
    fds_before = open_fds(heavy_gateway)
    for _ in range(10):  # announce 100 kB, send 10, go away
        with socket.create_connection(("127.0.0.1", heavy_gateway.http_port)) as connection:
            connection.sendall(
                b"POST /v2/models/busy/infer HTTP/1.1\r\nHost: gateway\r\nContent-Length: 100000\r\n\r\n" + b"0" * 10
            )
    failing = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 3]}]}
    answer = httpx.post(f"http://{heavy_gateway.http_url}/v2/models/faulty/infer", json=failing)
    assert answer.status_code == 500
    # The disconnects are noticed on the gateway's loop: by the time it closed their sockets, it logged what it would.
    assert wait_until(lambda: open_fds(heavy_gateway) <= fds_before + 1), (fds_before, open_fds(heavy_gateway))
    written = heavy_gateway.log.read_text()[len(log_before):]
    errors = [line for line in written.splitlines() if " ERROR " in line]
    assert len(errors) == 1, written[-3000:]
    assert answer.headers["x-request-id"] in errors[0]
    assert written.count("Traceback") <= 1, written[-3000:]
