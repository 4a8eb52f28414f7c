"""The file state store: routing survives restarts and SIGKILL, corrupt files are refused, one gateway per file,
and the audit log reads back newest-last across rotation and torn lines."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from services.gateway.state import Event, FileStateStore, RoutingRecord, StateError, default_state_path

ROOT = Path(__file__).resolve().parents[2]

# Children import the state package alone: the gateway package's __init__ pulls in the whole app, about a second
# per start, which would make the crash loop slow.
CHILD_PRELUDE = f"""
import asyncio, sys, types
from pathlib import Path
for name in ("services", "services.gateway"):
    package = types.ModuleType(name)
    package.__path__ = [str(Path({str(ROOT)!r}, *name.split(".")))]
    sys.modules[name] = package
from services.gateway.state import FileStateStore, RoutingRecord
"""

# Saves m0, m1, m2 in turn, each with the next generation, continuing from what the file holds.
WRITER = (
    CHILD_PRELUDE
    + """
async def main() -> None:
    store = FileStateStore(Path(sys.argv[1]))
    await store.open()
    generation = max((r.generation for r in (await store.load_routing()).values()), default=0)
    print("saving", flush=True)
    while True:
        generation += 1
        record = RoutingRecord(stable=generation, previous=generation - 1, generation=generation)
        await store.save_routing(f"m{generation % 3}", record)

asyncio.run(main())
"""
)

# Holds the store open until the first line on stdin, then closes it and waits for the second.
HOLDER = (
    CHILD_PRELUDE
    + """
async def main() -> None:
    store = FileStateStore(Path(sys.argv[1]))
    await store.open()
    print("open", flush=True)
    sys.stdin.readline()
    await store.close()
    print("closed", flush=True)
    sys.stdin.readline()

asyncio.run(main())
"""
)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "routing.json"


@pytest.fixture
async def store(path: Path) -> AsyncIterator[FileStateStore]:
    store = FileStateStore(path)
    await store.open()
    yield store
    await store.close()


@contextmanager
def _child(script: str, path: Path) -> Iterator[subprocess.Popen[str]]:
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        yield child
    finally:
        child.kill()
        child.wait()
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                stream.close()


def _temp_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def _check_writer_state(path: Path) -> int:
    """The routing file holds a set the writer saved in full: m0..m2 at the newest three generations."""
    models = json.loads(path.read_text())["models"]
    records = {model: RoutingRecord.from_json(raw) for model, raw in models.items()}
    newest = max(record.generation for record in records.values())
    expected = {f"m{g % 3}": g for g in range(max(1, newest - 2), newest + 1)}
    assert {model: record.generation for model, record in records.items()} == expected
    assert all(record.stable == record.generation for record in records.values())
    return newest


def _event(model: str, action: str, **versions: int | None) -> Event:
    return Event(action=action, model=model, result="ok", versions=versions, actor="gateway", steps={"load": 0.25})


async def test_load_routing_returns_saved_records_when_store_restarts(path: Path) -> None:
    first = FileStateStore(path)
    await first.open()
    assert await first.load_routing() == {}
    saved = {
        "classifier": RoutingRecord(stable=2, previous=1, generation=3),
        "mlp": RoutingRecord(stable=1),
        "empty-previous": RoutingRecord(stable=0, previous=None, generation=7),
    }
    await first.save_routing("classifier", RoutingRecord(stable=1))
    for model, record in saved.items():
        await first.save_routing(model, record)
    await first.close()
    await first.close()

    second = FileStateStore(path)
    await second.open()
    try:
        assert await second.load_routing() == saved
    finally:
        await second.close()
    document = json.loads(path.read_text())
    assert document == {"format": 1, "models": {m: r.to_json() for m, r in saved.items()}}


async def test_save_routing_keeps_every_model_when_saves_run_concurrently(path: Path, store: FileStateStore) -> None:
    records = {f"m{n}": RoutingRecord(stable=n, generation=n + 1) for n in range(20)}
    await asyncio.gather(*(store.save_routing(model, record) for model, record in records.items()))

    reopened = FileStateStore(path)
    await store.close()
    await reopened.open()
    try:
        assert await reopened.load_routing() == records
    finally:
        await reopened.close()


async def test_routing_file_holds_complete_record_set_when_writer_is_killed(path: Path) -> None:
    newest = 0
    for _ in range(6):
        with _child(WRITER, path) as writer:
            assert writer.stdout is not None
            assert writer.stdout.readline() == "saving\n"
            await asyncio.sleep(random.uniform(0.002, 0.04))  # the kill lands anywhere in its saves: what is tested
            writer.send_signal(signal.SIGKILL)
            assert writer.wait() == -signal.SIGKILL
        if path.exists():
            generation = _check_writer_state(path)
            assert generation >= newest
            newest = generation
    assert newest > 0, "the writer never completed a save"

    # A killed writer may leave its temp file; the next store to open removes it (and a planted one).
    (path.parent / f".{path.name}.planted.tmp").write_text("{")
    store = FileStateStore(path)
    await store.open()
    try:
        await store.save_routing("m0", RoutingRecord(stable=1, generation=newest + 1))
    finally:
        await store.close()
    assert _temp_files(path.parent) == []


async def test_save_routing_raises_and_keeps_previous_records_when_folder_is_replaced(
    path: Path, store: FileStateStore
) -> None:
    before = RoutingRecord(stable=1)
    await store.save_routing("a", before)
    folder, moved = path.parent, path.parent.with_name("moved")
    folder.rename(moved)
    folder.write_text("a file where the state folder was")

    with pytest.raises(StateError, match=str(path)):
        await store.save_routing("b", RoutingRecord(stable=2))

    assert json.loads((moved / path.name).read_text())["models"] == {"a": before.to_json()}
    assert await store.load_routing() == {"a": before}
    folder.unlink()
    moved.rename(folder)
    after = RoutingRecord(stable=3)
    await store.save_routing("c", after)
    assert json.loads(path.read_text())["models"] == {"a": before.to_json(), "c": after.to_json()}


async def test_save_routing_removes_temp_file_when_replace_fails(path: Path, store: FileStateStore) -> None:
    before = RoutingRecord(stable=1)
    await store.save_routing("a", before)
    path.unlink()
    (path / "occupied").mkdir(parents=True)

    with pytest.raises(StateError, match=str(path)):
        await store.save_routing("b", RoutingRecord(stable=2))

    assert _temp_files(path.parent) == []
    assert await store.load_routing() == {"a": before}
    (path / "occupied").rmdir()
    path.rmdir()
    await store.save_routing("c", RoutingRecord(stable=3))
    assert set(json.loads(path.read_text())["models"]) == {"a", "c"}


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        pytest.param('{"format": 1, "models": {', "not valid JSON", id="torn-json"),
        pytest.param("\xff\xfe", "not valid JSON", id="not-utf8-json"),
        pytest.param("[]", "not an object", id="array"),
        pytest.param('{"format": 2, "models": {}}', "format 2", id="newer-format"),
        pytest.param('{"models": {}}', "format None", id="no-format"),
        pytest.param('{"format": true, "models": {}}', "format True", id="bool-format"),
        pytest.param('{"format": 1, "models": []}', "'models'", id="models-array"),
        pytest.param('{"format": 1, "models": {"m": {"stable": -1}}}', "model 'm': 'stable'", id="bad-record"),
        pytest.param('{"format": 1, "models": {"m": {"stable": 1, "generation": 0}}}', "'generation'", id="gen-0"),
        # issue #28: each of these was a raw traceback at startup
        pytest.param("[" * 3000 + "]" * 3000, "not valid JSON", id="3000-brackets"),
        pytest.param('{"format": 1, "models": {"m": {"stable": %s}}}' % ("[" * 1000 + "]" * 1000), "levels deep",
                     id="1000-levels-in-a-record"),
        pytest.param('{"format": 1, "models": {"m": {"stable": %s}}}' % ("9" * 5000), "not valid JSON",
                     id="5000-digits"),
        pytest.param('{"format": 1, "models": {"m": {"stable": 1, "generation": 1, "canary": {"version": 2, '
                     '"weight": %s}}}}' % ("9" * 30), "'weight' must be a number from 0 to 100", id="30-digit-weight"),
        pytest.param('{"format": 1, "models": {"m": {"stable": 1e400}}}', "not valid JSON", id="float-overflow"),
        pytest.param('{"format": 1, "models": {"m": {"stable": 18446744073709551616}}}', "model 'm': 'stable'",
                     id="past-64-bits"),
    ],
)
async def test_load_routing_raises_naming_file_when_file_is_corrupt(
    path: Path, store: FileStateStore, content: str, problem: str
) -> None:
    path.write_text(content, encoding="latin-1")

    with pytest.raises(StateError) as raised:
        await store.load_routing()

    assert str(path) in str(raised.value)
    assert problem in str(raised.value)
    assert "fix or remove the file" in str(raised.value)


async def test_save_routing_leaves_corrupt_file_alone_when_it_cannot_be_read(path: Path, store: FileStateStore) -> None:
    path.write_text('{"format": 2}')

    with pytest.raises(StateError, match="format 2"):
        await store.save_routing("m", RoutingRecord(stable=1))

    assert path.read_text() == '{"format": 2}'


async def test_open_raises_naming_other_pid_when_another_process_holds_the_file(path: Path) -> None:
    with _child(HOLDER, path) as holder:
        assert holder.stdin is not None
        assert holder.stdout is not None
        assert holder.stdout.readline() == "open\n"
        store = FileStateStore(path)

        with pytest.raises(StateError, match=f"in use by another gateway \\(pid {holder.pid}") as raised:
            await store.open()
        assert "SWITCHYARD_STATE_PATH" in str(raised.value)

        holder.stdin.write("close\n")
        holder.stdin.flush()
        assert holder.stdout.readline() == "closed\n"
        await store.open()
        await store.close()


async def test_load_routing_raises_when_store_is_not_open(path: Path) -> None:
    with pytest.raises(RuntimeError, match="not open"):
        await FileStateStore(path).load_routing()


async def test_events_returns_newest_oldest_first_when_filtered_and_limited(store: FileStateStore) -> None:
    appended = [_event("a" if n % 2 == 0 else "b", f"load-{n}", version=n) for n in range(10)]
    for event in appended:
        await store.append_event(event)

    assert await store.events() == appended
    assert await store.events(limit=3) == appended[-3:]
    assert await store.events("a") == appended[0::2]
    assert await store.events("b", limit=2) == [appended[7], appended[9]]
    assert await store.events("nobody") == []
    assert await store.events(limit=0) == []


async def test_events_skips_torn_line_when_last_append_was_cut(store: FileStateStore) -> None:
    appended = [_event("m", "activate", to=n) for n in range(3)]
    for event in appended:
        await store.append_event(event)
    with store.events_path.open("ab") as log:
        log.write(b'{"action": "rollback", "mod')

    assert await store.events() == appended

    after = _event("m", "rollback", to=1)
    await store.append_event(after)
    assert await store.events() == [*appended, after]


@pytest.mark.parametrize("line", [b"[" * 3000 + b"]" * 3000, b'{"action": %s}' % (b"9" * 5000)],
                         ids=["3000-brackets", "5000-digits"])
async def test_events_skips_line_when_it_is_nested_or_huge(store: FileStateStore, line: bytes) -> None:
    appended = [_event("m", "activate", to=n) for n in range(2)]
    await store.append_event(appended[0])
    with store.events_path.open("ab") as log:
        log.write(line + b"\n")
    await store.append_event(appended[1])

    assert await store.events() == appended


async def test_events_reads_rotated_log_when_current_log_is_short(path: Path) -> None:
    store = FileStateStore(path, max_event_bytes=600)
    await store.open()
    try:
        appended = [_event("m", "activate", **{"from": n, "to": n + 1}) for n in range(12)]
        for event in appended:
            await store.append_event(event)
        rotated = store.events_path.with_name(store.events_path.name + ".1")
        current_count = len(store.events_path.read_bytes().splitlines())

        assert rotated.exists()
        assert store.events_path.stat().st_size <= 600
        assert rotated.stat().st_size <= 600
        assert current_count < 12
        assert await store.events(limit=current_count + 1) == appended[-current_count - 1 :]
        everything = await store.events()
        assert len(everything) > current_count
        assert everything == appended[-len(everything) :]
    finally:
        await store.close()


def test_default_state_path_is_outside_repository_when_xdg_state_home_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    repository = tmp_path / "models" / "model_repository"
    twin = tmp_path / "elsewhere" / "model_repository"
    repository.mkdir(parents=True)

    chosen = default_state_path(repository)

    assert chosen.is_relative_to(tmp_path / "state" / "switchyard")
    assert not chosen.is_relative_to(repository)
    assert chosen.name == "routing.json"
    assert chosen.parent.name.startswith("model_repository-")
    assert default_state_path(repository / ".." / "model_repository") == chosen
    assert default_state_path(twin) != chosen


def test_default_state_path_uses_home_when_xdg_state_home_is_unset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))

    chosen = default_state_path(tmp_path / "repo")

    assert chosen.is_relative_to(tmp_path / "home" / ".local" / "state" / "switchyard")


def test_events_log_sits_beside_routing_file_when_store_is_built(path: Path) -> None:
    store = FileStateStore(path)

    assert store.events_path == path.parent / "routing.events.jsonl"
    assert store.lock_path == path.parent / "routing.json.lock"
    assert os.fspath(store.path) == os.fspath(path)
