"""Where inference-log records go: a directory of JSON-lines files, a Redis stream, or an HTTP endpoint that takes
CloudEvents (as KServe's inference logger sends them). ``SWITCHYARD_INFERENCE_LOG`` names one by URL.

Every sink is called from the writer's thread only, one batch at a time: it may block, and it raises when a batch
did not get through (the writer counts and drops that batch, and tries again with the next)."""

from __future__ import annotations

import logging
import os
import re
import tempfile
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import httpx
import orjson
import redis

from services.inferlog.sources import shown

log = logging.getLogger(__name__)

URL_FORMS = (
    "file:///absolute/directory (JSON-lines files), "
    "redis://host:port/db?stream=NAME&maxlen=N (a Redis stream), "
    "http(s)://host/path (CloudEvents)"
)
DEFAULT_STREAM = "switchyard:inference-log"
DEFAULT_MAXLEN = 100_000
FILE_PREFIX = "inference-"
FILE_SUFFIX = ".jsonl"
_STAMPED = r"inference-\d{8}T\d{12}"
"""``inference-<UTC yyyymmddTHHMMSSffffff>``: fixed width, so sorting the names sorts the files by time; with several
workers each worker's files end ``-w<index>`` (``.jsonl`` after it), and each keeps and prunes its own."""
_STAMP = "%Y%m%dT%H%M%S%f"


class Sink(Protocol):
    def write(self, records: list[dict[str, Any]]) -> None:
        """Store the records, in order; raise when they were not stored."""

    def close(self) -> None:
        """Release the sink's file, connection or client."""


class SinkError(RuntimeError):
    """A sink refused a batch: where it was sent, what came back and what was expected."""


def open_sink(url: str, *, file_max_bytes: int, file_count: int, timeout_s: float, worker: int | None = None) -> Sink:
    """The sink ``url`` names; ``ValueError`` naming the three forms when it is none of them. ``worker``: this
    process's index among the node's workers (``serve --workers N``), which names its own log files."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ValueError(f"inference log URL {url!r}: a file URL names an absolute directory, file:///abs/dir")
        return JsonLinesSink(Path(unquote(parts.path)), max_bytes=file_max_bytes, count=file_count, worker=worker)
    if parts.scheme in ("redis", "rediss"):
        return RedisStreamSink(url, timeout_s=timeout_s)
    if parts.scheme in ("http", "https") and parts.netloc:
        return CloudEventsSink(url, timeout_s=timeout_s)
    raise ValueError(f"inference log URL {shown(url)!r} is not one of the forms read: {URL_FORMS}")


class JsonLinesSink:
    """Appends one record per line to the newest ``inference-<time>.jsonl`` in ``directory``; past ``max_bytes`` it
    starts a new file, and it keeps at most ``count`` files (the oldest go), so the disk it takes is bounded.

    A file holds whole lines only: a write the disk could take only part of is cut back to the last whole line before
    the batch fails. A folder it cannot write (at startup, or later) is said in the log and costs the records, never
    the serving; the folder is made again, and a file removed under the sink replaced, at the next batch."""

    def __init__(self, directory: Path, *, max_bytes: int, count: int, worker: int | None = None) -> None:
        """``worker``: the node's worker index, when there are several: this sink's files are its own (``-w<index>``),
        so that the workers never append to, or prune, each other's."""
        if max_bytes < 1 or count < 1:
            raise ValueError(f"a JSON-lines inference log needs max_bytes >= 1 and count >= 1, "
                             f"got max_bytes={max_bytes}, count={count}")
        self.directory = directory
        self.max_bytes = max_bytes
        self.count = count
        self._descriptor: int | None = None
        self._size = 0
        self._last_stamp: datetime | None = None
        self._suffix = (f"-w{worker}" if worker is not None else "") + FILE_SUFFIX
        self._own = re.compile(_STAMPED + re.escape(self._suffix))
        # Tried now, so that a folder the gateway cannot write is said at startup, not at the first sampled request.
        problem = self._unwritable()
        if problem is not None:
            log.warning("inference log (SWITCHYARD_INFERENCE_LOG): %s; the gateway serves on, and drops the records "
                        "(switchyard_inference_log_dropped_total{reason=\"sink_error\"}) until it can write there",
                        problem)

    def write(self, records: list[dict[str, Any]]) -> None:
        if self._descriptor is not None and os.fstat(self._descriptor).st_nlink == 0:
            self.close()  # its file was removed (the folder cleaned up): what went on there would be lost
        chunk: list[bytes] = []
        chunk_size = 0
        for record in records:
            line = orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
            if self._descriptor is None or (self._size + chunk_size > 0 and self._size + chunk_size + len(line) >
                                            self.max_bytes):
                self._flush(chunk)
                chunk, chunk_size = [], 0
                self._rotate()
            chunk.append(line)
            chunk_size += len(line)
        self._flush(chunk)

    def close(self) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None

    def files(self) -> list[Path]:
        """This sink's files, oldest first."""
        return sorted(path for path in self.directory.iterdir() if self._own.fullmatch(path.name))

    def _flush(self, chunk: list[bytes]) -> None:
        """One write per file and batch: a reader never sees half a batch's line, and the bytes reach the OS now."""
        if not chunk or self._descriptor is None:
            return
        data = memoryview(b"".join(chunk))
        try:
            written = 0
            while written < len(data):  # a regular file may take part of a write (the disk filled up)
                written += os.write(self._descriptor, data[written:])
        except OSError:
            self._cut_back()
            raise
        self._size += len(data)

    def _cut_back(self) -> None:
        """After a failed write: the file back to its last whole line, so that the next batch's lines do not follow
        half a line (a record no reader could parse, in the middle of the file). When even that fails, the file is
        left as it is, its last line unfinished (which readers skip), and the next batch starts a new one."""
        assert self._descriptor is not None
        try:
            os.ftruncate(self._descriptor, self._size)
        except OSError:
            self.close()

    def _rotate(self) -> None:
        self.close()
        self._descriptor = self._create()
        self._size = 0
        for old in self.files()[: -self.count]:
            old.unlink(missing_ok=True)  # another process may have removed it first

    def _unwritable(self) -> str | None:
        """Why the folder cannot take the log's files (``None`` when it can); makes it when it is not there."""
        try:
            self.directory.mkdir(mode=0o750, parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.directory):  # O_TMPFILE: leaves nothing behind
                pass
        except OSError as exc:
            return f"cannot write log files in {self.directory}: {exc.strerror or exc}"
        return None

    def _create(self) -> int:
        """A new file named after now; the name is created exclusively and always after the previous one, so a
        clock step back or two files in one microsecond never reuse (and append to) a name. The folder is made
        again when it was removed."""
        self.directory.mkdir(mode=0o750, parents=True, exist_ok=True)
        stamp = datetime.now(UTC)
        if self._last_stamp is not None and stamp <= self._last_stamp:
            stamp = self._last_stamp + timedelta(microseconds=1)
        while True:
            path = self.directory / f"{FILE_PREFIX}{stamp.strftime(_STAMP)}{self._suffix}"
            try:
                descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o640)
            except FileExistsError:
                stamp += timedelta(microseconds=1)
                continue
            self._last_stamp = stamp
            return descriptor


class RedisStreamSink:
    """``XADD <stream> MAXLEN ~ <maxlen> * record <json>`` per record, one pipeline per batch. The approximate
    MAXLEN lets Redis trim whole nodes, which keeps each XADD cheap; the stream holds at least ``maxlen``."""

    def __init__(self, url: str, *, timeout_s: float = 5.0) -> None:
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        self.stream = query.pop("stream", DEFAULT_STREAM) or DEFAULT_STREAM
        self.maxlen = _positive_int(query.pop("maxlen", str(DEFAULT_MAXLEN)), url)
        connection_url = urlunsplit(parts._replace(query=urlencode(query)))
        self._client: redis.Redis = redis.Redis.from_url(
            connection_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )

    def write(self, records: list[dict[str, Any]]) -> None:
        pipeline = self._client.pipeline(transaction=False)
        for record in records:
            pipeline.xadd(self.stream, {"record": orjson.dumps(record)}, maxlen=self.maxlen, approximate=True)
        pipeline.execute()

    def close(self) -> None:
        self._client.close()


def _positive_int(text: str, url: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"inference log URL {shown(url)!r}: maxlen must be a positive integer, got {text!r}")
    return value


REQUEST_TYPE = "org.kubeflow.serving.inference.request"
RESPONSE_TYPE = "org.kubeflow.serving.inference.response"


class CloudEventsSink:
    """Two CloudEvents per record in binary mode (the attributes in ``ce-`` headers, the body the v2 JSON), as
    KServe's inference logger sends them: the request, then the response (or its error). The extension attributes
    carry KServe's names (``inferenceservicename``, ``endpoint``) and ours (``modelversion``, ``traceid``)."""

    def __init__(self, url: str, *, timeout_s: float) -> None:
        self.url = url
        self._client = httpx.Client(timeout=timeout_s)

    def write(self, records: list[dict[str, Any]]) -> None:
        for record in records:
            self._post(request_event_headers(record), request_event_body(record))
            self._post(response_event_headers(record), response_event_body(record))

    def close(self) -> None:
        self._client.close()

    def _post(self, headers: Mapping[str, str], body: dict[str, Any]) -> None:
        answer = self._client.post(self.url, headers=headers, content=orjson.dumps(body))
        if not answer.is_success:
            raise SinkError(f"CloudEvents endpoint {shown(self.url)} answered {answer.status_code} to event "
                            f"{headers['ce-type']} {headers['ce-id']}; expected a 2xx status")


def request_event_headers(record: Mapping[str, Any]) -> dict[str, str]:
    return _event_headers(record, REQUEST_TYPE, record["time"])


def response_event_headers(record: Mapping[str, Any]) -> dict[str, str]:
    """Timed when the answer left: the arrival plus the latency."""
    arrived = datetime.fromisoformat(record["time"])
    answered = arrived + timedelta(milliseconds=record["latency_ms"])
    return _event_headers(record, RESPONSE_TYPE, answered.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))


def request_event_body(record: Mapping[str, Any]) -> dict[str, Any]:
    """The request as v2 JSON: its inputs, the outputs it asked for when it named them (with their parameters) and
    its request parameters when it had any."""
    request = record["request"]
    body: dict[str, Any] = {"inputs": request["inputs"]}
    if request.get("outputs") is not None:
        asked = request.get("output_parameters") or {}
        body["outputs"] = [
            {"name": name, "parameters": asked[name]} if name in asked else {"name": name}
            for name in request["outputs"]
        ]
    if request.get("parameters"):
        body["parameters"] = request["parameters"]
    return body


def response_event_body(record: Mapping[str, Any]) -> dict[str, Any]:
    """The answer as v2 JSON, or ``{"error": ...}`` as v2 answers a failure."""
    response = record.get("response")
    if response is None:
        return {"error": record.get("error") or f"status {record['status']}"}
    version = record.get("version")
    body: dict[str, Any] = {"model_name": record["model"]}
    if version is not None:
        body["model_version"] = str(version)
    body["id"] = record["id"]
    body["outputs"] = response["outputs"]
    return body


def _event_headers(record: Mapping[str, Any], event_type: str, time: str) -> dict[str, str]:
    headers = {
        "ce-specversion": "1.0",
        "ce-id": str(record["id"]),
        "ce-source": "switchyard",
        "ce-type": event_type,
        "ce-time": time,
        "content-type": "application/json",
        "ce-inferenceservicename": str(record["model"]),
    }
    optional = (("ce-modelversion", record.get("version")), ("ce-endpoint", record.get("route")),
                ("ce-traceid", record.get("trace_id")))
    headers.update((name, str(value)) for name, value in optional if value is not None)
    return headers
