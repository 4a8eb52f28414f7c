"""``--write``: the winner's config replaces config.pbtxt in one rename, the old file is kept as a backup, the trial
table is recorded beside it, and a reader never sees a partial file; nothing is written when publishing fails."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from services.gateway.tuning.candidates import Candidate, applied, current
from services.gateway.tuning.publish import PublishError, publish
from services.modelrepo.config import read_config, to_text
from services.modelrepo.layout import CONFIG_FILE


def model_folder(root: Path) -> tuple[Path, mc.ModelConfig]:
    config = mc.ModelConfig(name="m", platform="onnxruntime_onnx", max_batch_size=32)
    config.instance_group.add(count=2, kind=mc.ModelInstanceGroup.KIND_CPU)
    config.dynamic_batching.max_queue_delay_microseconds = 2000
    folder = root / "m"
    (folder / "1").mkdir(parents=True)
    (folder / CONFIG_FILE).write_text(to_text(config))
    return folder, config


def test_publish_replaces_config_and_keeps_backup_when_winner_is_written(tmp_path: Path) -> None:
    folder, config = model_folder(tmp_path)
    before = (folder / CONFIG_FILE).read_text()
    winner = Candidate(1, 300, (8,), 16)
    done = publish(tmp_path, folder, winner, {"winner": {"number": 4}})
    assert read_config(folder) == applied(config, winner)
    assert done.backup.read_text() == before
    assert done.backup.name.startswith(f"{CONFIG_FILE}.bak-")
    assert json.loads(done.table.read_text()) == {"winner": {"number": 4}}
    assert sorted(p.name for p in folder.iterdir()) == sorted(["1", CONFIG_FILE, done.backup.name, done.table.name])


def test_publish_never_shows_partial_config_when_read_while_writing(tmp_path: Path) -> None:
    folder, config = model_folder(tmp_path)
    winners = [Candidate(n % 3 + 1, n * 10, (), 32) for n in range(30)]
    expected = {to_text(config), *(to_text(applied(config, w)) for w in winners)}
    seen: list[str] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            seen.append((folder / CONFIG_FILE).read_text())

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for winner in winners:
            publish(tmp_path, folder, winner, {})
    finally:
        stop.set()
        reader.join()
    assert len(seen) > 30
    assert set(seen) <= expected  # every read a whole config, old or new
    text_format.Parse(seen[-1], mc.ModelConfig())


def test_publish_writes_nothing_when_config_is_gone(tmp_path: Path) -> None:
    folder, config = model_folder(tmp_path)
    (folder / CONFIG_FILE).unlink()
    with pytest.raises(PublishError, match="is gone"):
        publish(tmp_path, folder, current(config), {})
    assert [p.name for p in folder.iterdir()] == ["1"]


def test_publish_applies_winner_to_config_on_disk_when_it_changed_during_the_run(tmp_path: Path) -> None:
    folder, config = model_folder(tmp_path)
    edited = mc.ModelConfig()
    edited.CopyFrom(config)
    edited.parameters["tokenizer"].string_value = "v2"  # an edit made while the trials ran
    (folder / CONFIG_FILE).write_text(to_text(edited))
    winner = Candidate(1, 300, (8,), 16)
    done = publish(tmp_path, folder, winner, {})
    assert read_config(folder) == applied(edited, winner)  # the file it replaced, with the winner's four settings
    assert done.backup.read_text() == to_text(edited)


def test_publish_writes_nothing_when_config_on_disk_cannot_be_tuned(tmp_path: Path) -> None:
    folder, config = model_folder(tmp_path)
    config.sequence_batching.max_sequence_idle_microseconds = 5_000_000  # replaces dynamic_batching (a oneof)
    (folder / CONFIG_FILE).write_text(to_text(config))
    with pytest.raises(PublishError, match="uses sequence_batching"):
        publish(tmp_path, folder, Candidate(1, 300, (8,), 16), {})
    assert read_config(folder) == config
    assert sorted(p.name for p in folder.iterdir()) == ["1", CONFIG_FILE]


def test_publish_syncs_backup_and_its_folder_entry_when_config_is_replaced_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A power cut right after config.pbtxt's rename must find the backup whole beside it: the backup's bytes are
    fsynced under the name they end with, and the folder (its entry) after it got that name, both before the config
    is replaced. Watched at the system calls (each still made), since a power cut cannot be made in a test."""
    folder, _ = model_folder(tmp_path)
    before = (folder / CONFIG_FILE).read_text()
    calls: list[tuple[str, str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append(("fsync", os.path.realpath(f"/proc/self/fd/{fd}"), ""))
        real_fsync(fd)

    def replace(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        calls.append(("replace", os.path.realpath(source), os.path.realpath(target)))
        real_replace(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    done = publish(tmp_path, folder, Candidate(1, 300, (8,), 16), {})
    backup, config, where = (os.path.realpath(p) for p in (done.backup, folder / CONFIG_FILE, folder))
    replaced = next(i for i, call in enumerate(calls) if call[0] == "replace" and call[2] == config)
    # The bytes synced, under the backup's name or a temporary one then renamed to it.
    named = [i for i, call in enumerate(calls) if call[0] == "replace" and call[2] == backup]
    names = {backup, *(calls[n][1] for n in named)}
    synced = [i for i, call in enumerate(calls) if call[0] == "fsync" and call[1] in names]
    assert synced, calls
    assert synced[0] < replaced, calls
    entry_made = named[0] if named else synced[0]
    assert ("fsync", where, "") in calls[entry_made:replaced], calls
    assert done.backup.read_text() == before
