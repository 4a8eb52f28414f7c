"""Reading the inference log back: a JSON-lines directory (file order, line order, the line being written), a Redis
stream in pages, the model filter and the limits, and an error that names the file and line of a bad record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from services.inferlog import sources
from services.inferlog.format import RecordError, encode_tensor
from services.inferlog.sources import SourceError, read_records, shown
from tests.redis_server import redis_server


def record(number: int, model: str = "double") -> dict[str, Any]:
    values = np.full((1, 4), number, dtype=np.float32)
    return {
        "format": 1, "id": f"r{number}", "trace_id": None, "time": "2026-12-05T06:01:02.000000Z", "model": model,
        "version": 1, "route": "pinned", "protocol": "http", "latency_ms": 1.0, "status": 200, "error": None,
        "truncated": False, "redacted": [],
        "request": {"inputs": [encode_tensor("x", "FP32", values)], "outputs": None},
        "response": {"outputs": [encode_tensor("y", "FP32", values * 2)]},
    }


def write_log(folder: Path, files: dict[str, list[dict[str, Any]]], *, partial: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, records in files.items():
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in records))
    if partial:
        with (folder / max(files)).open("a") as newest:
            newest.write(partial)
    return folder


def ids(records: Any) -> list[str]:
    return [r["id"] for r in records]


FIRST, SECOND = "inference-20261205T060000000000.jsonl", "inference-20261205T070000000000.jsonl"


def test_directory_yields_files_in_name_order_and_skips_the_newest_files_partial_line(tmp_path: Path) -> None:
    folder = write_log(tmp_path, {SECOND: [record(3), record(4)], FIRST: [record(1), record(2)]}, partial='{"form')
    (tmp_path / "other.txt").write_text("not a log file\n")
    assert ids(read_records(str(folder))) == ["r1", "r2", "r3", "r4"]
    assert ids(read_records(f"file://{folder}")) == ["r1", "r2", "r3", "r4"]


def test_a_record_cut_short_in_an_older_file_is_skipped_with_a_warning(tmp_path: Path) -> None:
    """The gateway killed while it wrote a record leaves that line unfinished; it writes on in a new file when it
    starts again. Each worker has its files: its newest file's unfinished line is a record being written."""
    worker_0, worker_1 = "inference-20261205T060000000000-w0.jsonl", "inference-20261205T050000000000-w1.jsonl"
    logged = {FIRST: [record(1)], SECOND: [record(2)], worker_0: [record(3)], worker_1: [record(4)]}
    folder = write_log(tmp_path, logged)
    for name in (FIRST, worker_1):  # FIRST has a newer file (SECOND); worker 1's only file is its newest
        with (folder / name).open("a") as cut:
            cut.write('{"format": 1, "id": "cut", "mod')
    warnings: list[str] = []
    assert ids(read_records(str(folder), warn=warnings.append)) == ["r4", "r3", "r1", "r2"]
    assert warnings == [f"{folder / FIRST}, line 2: a record cut short (the gateway stopped while writing it); skipped"]


def test_the_log_is_read_as_it_was_when_reading_began(tmp_path: Path) -> None:
    """A gateway may be writing the log while it is replayed (into that gateway): what is appended afterwards, the
    replay's own requests among it, is not read, or the replay would never end."""
    folder = write_log(tmp_path, {FIRST: [record(1)], SECOND: [record(2)]})
    records = read_records(str(folder))
    assert ids([next(records)]) == ["r1"]
    with (folder / SECOND).open("a") as newest:
        newest.write(json.dumps(record(3)) + "\n")
    (folder / "inference-20261205T080000000000.jsonl").write_text(json.dumps(record(4)) + "\n")
    assert ids(records) == ["r2"]
    assert ids(read_records(str(folder))) == ["r1", "r2", "r3", "r4"]


def test_model_filter_and_limits_take_the_first_or_the_newest_records_oldest_first(tmp_path: Path) -> None:
    logged = [record(1), record(2, "other"), record(3), record(4), record(5, "other"), record(6)]
    folder = str(write_log(tmp_path, {FIRST: logged[:3], SECOND: logged[3:]}))
    assert ids(read_records(folder, model="double")) == ["r1", "r3", "r4", "r6"]
    assert ids(read_records(folder, model="double", limit=2)) == ["r1", "r3"]
    assert ids(read_records(folder, model="double", limit=2, newest=True)) == ["r4", "r6"]
    assert ids(read_records(folder, model="absent")) == []


def test_a_malformed_line_is_an_error_naming_its_file_and_line(tmp_path: Path) -> None:
    folder = write_log(tmp_path, {FIRST: [record(1)], SECOND: [record(2)]})
    with (folder / FIRST).open("a") as first:  # a torn line in a finished file is damage, not a write in progress
        first.write('{"format": 1, "model"\n')
    with pytest.raises(RecordError, match=rf"{FIRST}, line 2: not a JSON record"):
        list(read_records(str(folder)))
    (folder / FIRST).write_text(json.dumps(record(1) | {"format": 7}) + "\n")
    with pytest.raises(RecordError, match=rf"{FIRST}, line 1: record format 7 is not 1"):
        list(read_records(str(folder)))


def test_a_source_that_does_not_exist_is_named_at_once(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=f"{tmp_path / 'missing'} does not exist"):
        read_records(str(tmp_path / "missing"))
    with pytest.raises(SourceError, match="not a source this reads"):
        read_records("s3://bucket/log")
    with pytest.raises(SourceError, match=r"name the stream once, as redis://host:port/db\?stream=NAME"):
        read_records("redis://127.0.0.1:1/0")


@pytest.mark.slow  # starts redis-server
def test_redis_stream_is_read_in_pages_and_a_missing_stream_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import redis

    monkeypatch.setattr(sources, "REDIS_PAGE", 3)  # 7 entries: pages of 3, 3 and 1
    with redis_server(tmp_path / "redis") as server:
        client = redis.Redis.from_url(server.url)
        for number in range(1, 8):
            client.xadd("log", {"record": json.dumps(record(number, "double" if number != 4 else "other"))})
        client.xadd("log", {"other": "x"})
        url = f"{server.url}?stream=log"
        assert ids(read_records(url, model="double", limit=6)) == ["r1", "r2", "r3", "r5", "r6", "r7"]
        with pytest.raises(RecordError, match=r"stream 'log' entry \d+-\d+: no 'record' field"):
            list(read_records(url))
        with pytest.raises(SourceError, match="has no stream 'absent'"):
            read_records(f"{server.url}?stream=absent")
        client.close()
        port = server.port
    with pytest.raises(SourceError, match="cannot read the Redis stream 'log'"):
        read_records(f"redis://127.0.0.1:{port}/0?stream=log")


def test_a_sources_password_is_never_shown() -> None:
    assert shown("redis://:pw-1@h:6379/0?stream=s") == "redis://:<password>@h:6379/0?stream=s"
    assert shown("rediss://ops:p%40ss@h/2?stream=s&maxlen=5") == "rediss://ops:<password>@h/2?stream=s&maxlen=5"
    assert shown("redis://h/0?stream=s&password=pw-2") == "redis://h/0?stream=s&password=<password>"
    for plain in ("redis://ops@h/0?stream=s", "/var/log/switchyard", "file:///var/log/switchyard"):
        assert shown(plain) == plain
