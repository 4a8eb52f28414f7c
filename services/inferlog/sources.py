"""Reading the inference log back: records from a JSON-lines directory or a Redis stream, oldest first.

``switchyard replay`` reads every record of a model (or the first ``limit``); an activation's replay check reads the
newest ``limit`` (``newest=True``), which are what the serving version answers now. Every record goes through
``format.check_record``: a line that is not a record is an error naming its file and line (or stream entry), never
skipped silently, because a replay that quietly compares fewer answers than the log holds would pass too easily.
One line is skipped: the last of a file when it has no line end. In the newest file of its writer (each worker
writes its own files) that is the record being written; in an older one, a record the gateway stopped writing (it was
killed) and never finishes: that one is skipped with a warning (``warn``) naming the file and line.

Imports the standard library only at module level (the ops CLI starts fast); ``redis`` when a stream is read."""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

from services.inferlog.format import RecordError, check_record

__all__ = ["FILE_PATTERN", "REDIS_PAGE", "SourceError", "read_records", "shown"]

FILE_PATTERN = "inference-*.jsonl"
"""The log's files in a directory; their names sort by the time they were started."""
REDIS_PAGE = 500
"""Stream entries per XRANGE call: large enough to be quick, small enough not to hold a big stream in one reply."""


class SourceError(Exception):
    """The log itself cannot be read (a missing directory, a stream that is not there, Redis down, a bad URL); the
    message names the source and how to fix the call."""


def read_records(
    source: str, *, model: str | None = None, limit: int | None = None, newest: bool = False,
    warn: Callable[[str], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """The records of ``source`` (a directory path, ``file:///abs/dir`` or ``redis://host:port/db?stream=NAME``) in
    the order they were written, only ``model``'s when given, at most ``limit``: the first ones, or with ``newest``
    the last ones (still oldest first). ``SourceError`` when the source cannot be read, ``RecordError`` (naming the
    file and line, or the stream entry) for an entry that is not a record. ``warn`` is told of a record cut short
    (the gateway was killed while it wrote it), which is skipped."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be 0 or more, got {limit}")
    records = _records_of(source, warn)
    if model is not None:
        records = (record for record in records if record["model"] == model)
    if limit is None:
        return records
    if newest:
        return iter(collections.deque(records, maxlen=limit))
    return _first(records, limit)


def _records_of(source: str, warn: Callable[[str], None] | None) -> Iterator[dict[str, Any]]:
    if source.startswith("redis://") or source.startswith("rediss://"):
        return _stream_records(source)
    if source.startswith("file://"):
        parts = urlsplit(source)
        if parts.netloc not in ("", "localhost"):
            raise SourceError(f"{source}: a file:// source names a local directory, as file:///absolute/path")
        return _directory_records(Path(unquote(parts.path)), warn)
    if "://" in source:
        raise SourceError(
            f"{shown(source)}: not a source this reads; give a directory, file:///absolute/dir "
            "or redis://host:port/db?stream=NAME"
        )
    return _directory_records(Path(source), warn)


def _first(records: Iterable[dict[str, Any]], limit: int) -> Iterator[dict[str, Any]]:
    if limit == 0:
        return
    for count, record in enumerate(records, start=1):
        yield record
        if count >= limit:
            return


# -- a JSON-lines directory -----------------------------------------------------------------------------------
def _directory_records(folder: Path, warn: Callable[[str], None] | None) -> Iterator[dict[str, Any]]:
    """Checked before the first record is asked for: a wrong path is reported at once, not on first iteration."""
    if not folder.is_dir():
        what = "is not a directory" if folder.exists() else "does not exist"
        raise SourceError(f"inference log directory {folder} {what}; give the directory SWITCHYARD_INFERENCE_LOG names")
    # The log as it is now: its files and their sizes, read no further. A gateway may still be writing it, and a
    # replay sent to that gateway would otherwise read the records of its own requests, without end.
    files = [(path, path.stat().st_size) for path in sorted(folder.glob(FILE_PATTERN))]
    return _lines_of(files, warn)


_WRITER = re.compile(r"inference-\d{8}T\d{12}(.*)\.jsonl")
"""A log file's name: its writer (``-w<index>`` with several workers, else nothing) follows the time."""


def _lines_of(files: list[tuple[Path, int]], warn: Callable[[str], None] | None) -> Iterator[dict[str, Any]]:
    newest = {_writer(path): path for path, _ in files}  # sorted by time: the last one of each writer stays
    for path, size in files:
        with path.open("rb") as handle:
            text = handle.read(size)
        for number, line in enumerate(text.splitlines(keepends=True), start=1):
            if not line.endswith(b"\n"):
                # The newest file's writer is in the middle of this line: not a record yet. An older file's writer
                # went on to a newer file: it stopped while writing this one (killed), and never finishes it.
                if warn is not None and newest[_writer(path)] != path:
                    warn(f"{path}, line {number}: a record cut short (the gateway stopped while writing it); "
                         "skipped")
                break
            if line.strip():
                yield _parsed(line, f"{path}, line {number}")


def _writer(path: Path) -> str:
    matched = _WRITER.fullmatch(path.name)
    return matched.group(1) if matched else path.name


# -- a Redis stream -------------------------------------------------------------------------------------------
def _stream_records(url: str) -> Iterator[dict[str, Any]]:
    """Opens the connection and checks the stream before the first record is asked for."""
    import redis  # only here: the ops CLI imports this module at startup

    stream = _stream_name(url)
    client = redis.Redis.from_url(url.split("?", 1)[0], socket_connect_timeout=5, socket_timeout=30)
    try:
        exists = client.exists(stream)
    except redis.RedisError as exc:
        client.close()
        raise SourceError(f"cannot read the Redis stream '{stream}' at {shown(url)}: {exc}") from None
    if not exists:
        client.close()
        raise SourceError(f"Redis at {shown(url)} has no stream '{stream}'; check ?stream= and the database")
    return _stream_pages(client, stream, url)


def _stream_pages(client: Any, stream: str, url: str) -> Iterator[dict[str, Any]]:
    import redis

    start = "-"
    try:
        try:  # the stream as it is now: entries added while it is read (a replay's own requests) are not
            last = client.xrevrange(stream, count=1)
        except redis.RedisError as exc:
            raise SourceError(f"reading the Redis stream '{stream}' at {shown(url)} failed: {exc}") from None
        if not last:
            return
        end = _text(last[0][0])
        while True:
            try:
                page = client.xrange(stream, min=start, max=end, count=REDIS_PAGE)
            except redis.RedisError as exc:
                raise SourceError(f"reading the Redis stream '{stream}' at {shown(url)} failed: {exc}") from None
            for entry_id, fields in page:
                yield _stream_record(stream, entry_id, fields)
            if len(page) < REDIS_PAGE:
                return
            start = "(" + _text(page[-1][0])  # exclusive: the page after the last entry read
    finally:
        client.close()


def _stream_record(stream: str, entry_id: object, fields: dict[Any, Any]) -> dict[str, Any]:
    where = f"stream '{stream}' entry {_text(entry_id)}"
    value = fields.get(b"record", fields.get("record"))
    if value is None:
        raise RecordError(f"{where}: no 'record' field (fields: {', '.join(_text(key) for key in fields)})")
    return _parsed(value if isinstance(value, bytes) else str(value).encode(), where)


def _stream_name(url: str) -> str:
    names = parse_qs(urlsplit(url).query).get("stream", [])
    if len(names) != 1 or not names[0]:
        raise SourceError(f"{shown(url)}: name the stream once, as redis://host:port/db?stream=NAME")
    return names[0]


def shown(source: str) -> str:
    """``source`` as it may be shown (in an error, a report, the audit log): a URL's password, in its user part or
    as a ``password`` query parameter, replaced by ``<password>``."""
    parts = urlsplit(source)
    if not parts.scheme or (parts.password is None and "password" not in parse_qs(parts.query)):
        return source
    netloc = parts.netloc
    if parts.password is not None:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.partition(':')[0]}:<password>@{host}"
    query = "&".join(
        f"{name}=<password>" if name == "password" else f"{name}={value}" if equals else name
        for name, equals, value in (item.partition("=") for item in parts.query.split("&"))
    )
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _parsed(raw: bytes, where: str) -> dict[str, Any]:
    try:
        return check_record(json.loads(raw))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecordError(f"{where}: not a JSON record ({exc})") from None
    except RecordError as exc:
        raise RecordError(f"{where}: {exc}") from None
