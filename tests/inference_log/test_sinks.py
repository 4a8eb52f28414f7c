"""The three sinks against the real thing: files in a directory, a redis-server, a local HTTP receiver."""

from __future__ import annotations

import errno
import logging
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from services.gateway.inference_log.sinks import JsonLinesSink, RedisStreamSink, SinkError, open_sink
from services.inferlog.sources import read_records
from tests.redis_server import redis_server


def _records(count: int) -> list[dict[str, Any]]:
    return [
        {"format": 1, "id": f"req-{index:05d}", "trace_id": None, "time": "2026-12-05T06:01:02.123456Z",
         "model": "mlp", "version": 2, "route": "stable", "protocol": "http", "latency_ms": 1.5, "status": 200,
         "error": None, "truncated": False, "redacted": [],
         "request": {"inputs": [{"name": "IN", "datatype": "INT64", "shape": [1], "data": [index]}], "outputs": None},
         "response": {"outputs": [{"name": "OUT", "datatype": "INT64", "shape": [1], "data": [index * 2]}]}}
        for index in range(count)
    ]


def _write_in_batches(sink: JsonLinesSink | RedisStreamSink, records: list[dict[str, Any]], size: int) -> None:
    for start in range(0, len(records), size):
        sink.write(records[start:start + size])


def _lines(files: list[Path]) -> list[dict[str, Any]]:
    return [orjson.loads(line) for path in files for line in path.read_bytes().splitlines()]


def test_json_lines_rotate_and_keep_every_record_in_order(tmp_path: Path) -> None:
    records = _records(1000)
    sink = JsonLinesSink(tmp_path / "log", max_bytes=20_000, count=1000)
    _write_in_batches(sink, records, 37)
    sink.close()

    files = sink.files()
    assert len(files) > 5  # ~420 bytes a line: rotated many times
    assert all(path.stat().st_size <= 20_000 for path in files)
    assert _lines(files) == records


def test_json_lines_keep_only_the_newest_files(tmp_path: Path) -> None:
    records = _records(1000)
    directory = tmp_path / "log"
    sink = JsonLinesSink(directory, max_bytes=20_000, count=3)
    _write_in_batches(sink, records, 37)
    sink.close()

    files = sink.files()
    assert len(files) == 3
    assert sorted(path.name for path in directory.iterdir()) == [path.name for path in files]
    kept = _lines(files)
    assert kept == records[-len(kept):]  # the newest records, with no gap


def test_workers_sharing_a_folder_keep_and_prune_only_their_own_files(tmp_path: Path) -> None:
    records = _records(600)
    directory = tmp_path / "log"
    sinks = [JsonLinesSink(directory, max_bytes=20_000, count=2, worker=index) for index in (0, 1)]
    for start in range(0, 600, 30):  # interleaved, as two workers write
        sinks[(start // 30) % 2].write(records[start:start + 30])
    for sink in sinks:
        sink.close()
    files = [sink.files() for sink in sinks]
    assert [len(own) for own in files] == [2, 2]
    assert all(path.name.endswith(f"-w{index}.jsonl") for index, own in enumerate(files) for path in own)
    assert sorted(path.name for path in directory.iterdir()) == sorted(path.name for own in files for path in own)
    by_worker = [_lines(own) for own in files]
    assert all(record["id"] in {r["id"] for r in records} for lines in by_worker for record in lines)
    assert {record["id"] for record in by_worker[0]}.isdisjoint(record["id"] for record in by_worker[1])


def test_a_restarted_json_lines_sink_starts_a_new_file_and_honours_the_cap(tmp_path: Path) -> None:
    first = JsonLinesSink(tmp_path, max_bytes=1_000_000, count=2)
    first.write(_records(3))
    first.close()
    second = JsonLinesSink(tmp_path, max_bytes=1_000_000, count=2)
    second.write(_records(2))
    second.write(_records(1))
    second.close()
    assert [len(path.read_bytes().splitlines()) for path in second.files()] == [3, 3]


PART_WRITTEN = """
import resource, signal, sys
from pathlib import Path
from services.gateway.inference_log.sinks import JsonLinesSink
from tests.inference_log.test_sinks import _records

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit a write fails with EFBIG instead of killing us
records = _records(40)
sink = JsonLinesSink(Path(sys.argv[1]), max_bytes=1 << 20, count=4)
sink.write(records[:10])
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (sink.files()[0].stat().st_size + 1000, hard))  # the disk fills up
try:
    sink.write(records[10:30])  # the first 2 lines and a half fit
except OSError as exc:
    print(exc.errno)
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # room again
sink.write(records[30:])
sink.close()
"""


def test_a_batch_the_disk_takes_only_part_of_leaves_no_half_line_in_the_file(tmp_path: Path) -> None:
    """A full disk takes part of a write: the half line it leaves would make every later replay of the folder fail
    at that line. Run in a process of its own: a file size limit (the full disk) holds for the whole process."""
    done = subprocess.run([sys.executable, "-c", PART_WRITTEN, str(tmp_path)], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(errno.EFBIG)  # the batch did fail
    assert [record["id"] for record in read_records(str(tmp_path))] == [f"req-{i:05d}" for i in [*range(10),
                                                                                                   *range(30, 40)]]


def test_a_folder_the_sink_cannot_write_is_said_at_once_and_written_once_it_can(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the log's folder should be\n")
    with caplog.at_level(logging.WARNING, logger="services.gateway.inference_log.sinks"):
        sink = JsonLinesSink(blocker / "log", max_bytes=20_000, count=2)
    assert f"cannot write log files in {blocker / 'log'}" in caplog.text
    assert "SWITCHYARD_INFERENCE_LOG" in caplog.text
    with pytest.raises(OSError, match="not-a-folder"):
        sink.write(_records(2))
    blocker.unlink()
    sink.write(_records(3))
    sink.close()
    assert _lines(sink.files()) == _records(3)


def test_a_log_folder_removed_under_the_sink_is_made_again_with_the_next_records(tmp_path: Path) -> None:
    """Removed (an operator freeing the disk): the file the sink holds open is gone, and what it appended there
    would be lost while the metrics counted it written."""
    records = _records(6)
    sink = JsonLinesSink(tmp_path / "log", max_bytes=1_000_000, count=2)
    sink.write(records[:3])
    shutil.rmtree(tmp_path / "log")
    sink.write(records[3:])
    sink.close()
    assert _lines(sink.files()) == records[3:]


@pytest.mark.slow
def test_a_redis_stream_gets_one_entry_per_record_and_is_trimmed(tmp_path: Path) -> None:
    with redis_server(tmp_path / "redis") as server:
        records = _records(1000)
        sink = RedisStreamSink(f"{server.url}?stream=infer&maxlen=5000")
        _write_in_batches(sink, records, 256)
        client: Any = redis.Redis.from_url(server.url)  # its answers' types depend on decode_responses
        entries = client.xrange("infer")
        assert [orjson.loads(fields[b"record"]) for _, fields in entries] == records

        trimmed = open_sink(f"{server.url}?stream=short&maxlen=10", file_max_bytes=1, file_count=1, timeout_s=5)
        _write_in_batches(trimmed, records, 256)  # type: ignore[arg-type]
        length = client.xlen("short")
        assert 10 <= length < 1000  # approximate MAXLEN: Redis trims whole nodes of the stream
        newest = client.xrevrange("short", count=1)[0][1][b"record"]
        assert orjson.loads(newest) == records[-1]
        sink.close()
        trimmed.close()
        client.close()


class _Receiver(BaseHTTPRequestHandler):
    """Keeps what it was sent on its server; answers the server's ``status``."""

    server: _ReceivingServer

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        self.server.received.append(({key.lower(): value for key, value in self.headers.items()}, orjson.loads(body)))
        self.send_response(self.server.status)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep the test's output clean


class _ReceivingServer(ThreadingHTTPServer):
    received: list[tuple[dict[str, str], dict[str, Any]]]
    status: int


@pytest.fixture
def receiver() -> Iterator[_ReceivingServer]:
    server = _ReceivingServer(("127.0.0.1", 0), _Receiver)
    server.received, server.status = [], 200
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(5)


def _url(server: _ReceivingServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/events"


def test_cloud_events_carry_the_request_then_the_response(receiver: _ReceivingServer) -> None:
    served, failed = _records(2)
    served.update(trace_id="4bf92f3577b34da6a3ce929d0e0e4736", time="2026-12-05T06:01:02.123456Z", latency_ms=2.5)
    served["request"]["outputs"] = ["OUT"]
    failed.update(version=None, route=None, response=None, status=404, error="unknown model 'mlp'")
    sink = open_sink(_url(receiver), file_max_bytes=1, file_count=1, timeout_s=5)
    sink.write([served, failed])
    sink.close()

    (request_headers, request_body), (response_headers, response_body), _, (failure_headers, failure_body) = (
        receiver.received
    )
    common = {"ce-specversion": "1.0", "ce-id": "req-00000", "ce-source": "switchyard", "content-type":
              "application/json", "ce-inferenceservicename": "mlp", "ce-modelversion": "2", "ce-endpoint": "stable",
              "ce-traceid": "4bf92f3577b34da6a3ce929d0e0e4736"}
    assert request_headers.items() >= {**common, "ce-type": "org.kubeflow.serving.inference.request",
                                       "ce-time": "2026-12-05T06:01:02.123456Z"}.items()
    assert request_body == {"inputs": served["request"]["inputs"], "outputs": [{"name": "OUT"}]}
    assert response_headers.items() >= {**common, "ce-type": "org.kubeflow.serving.inference.response",
                                        "ce-time": "2026-12-05T06:01:02.125956Z"}.items()
    assert response_body == {"model_name": "mlp", "model_version": "2", "id": "req-00000",
                             "outputs": served["response"]["outputs"]}
    assert failure_body == {"error": "unknown model 'mlp'"}
    assert failure_headers["ce-id"] == "req-00001"
    assert not {"ce-modelversion", "ce-endpoint", "ce-traceid"} & failure_headers.keys()


def test_a_cloud_events_endpoint_that_refuses_fails_the_batch(receiver: _ReceivingServer) -> None:
    receiver.status = 503
    sink = open_sink(_url(receiver), file_max_bytes=1, file_count=1, timeout_s=5)
    with pytest.raises(SinkError, match="answered 503 .* expected a 2xx status"):
        sink.write(_records(1))
    sink.close()


def test_the_password_of_a_sinks_url_stays_out_of_its_errors(receiver: _ReceivingServer) -> None:
    """The writer logs a failed batch's error: an endpoint's credentials must not go to the gateway's log."""
    receiver.status = 401
    url = _url(receiver).replace("http://", "http://collector:sink-password-5b2e@")
    sink = open_sink(url, file_max_bytes=1, file_count=1, timeout_s=5)
    with pytest.raises(SinkError, match="answered 401") as refused:
        sink.write(_records(1))
    sink.close()
    assert receiver.received[0][0]["authorization"].startswith("Basic ")  # the credentials did go to the endpoint
    assert "sink-password-5b2e" not in str(refused.value)
    assert "collector:<password>@" in str(refused.value)
    with pytest.raises(ValueError, match="maxlen must be a positive integer") as wrong:
        open_sink("redis://:redis-password-71c9@127.0.0.1:1/0?maxlen=0", file_max_bytes=1, file_count=1, timeout_s=1)
    assert "redis-password-71c9" not in str(wrong.value)


@pytest.mark.parametrize("url", ["ftp://host/x", "file://relative/dir", "file:relative", "redis://h:1/0?maxlen=0",
                                 "http:///no-host", "/var/log/inference"])
def test_a_url_of_no_known_form_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="inference log URL"):
        open_sink(url, file_max_bytes=1000, file_count=2, timeout_s=1)
