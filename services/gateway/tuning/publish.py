"""``--write``: the winner becomes the model's ``config.pbtxt``. Under the repository's publish lock the old file
is read and kept as ``config.pbtxt.bak-<time>`` (on disk, its folder entry too, before anything is replaced: a power
cut never leaves a rewritten config beside a missing or empty backup), the winner's settings are applied to it (so
the new file is the old one with those four settings, whatever changed on disk during the run), written beside it,
flushed, and renamed over it (readers see the old or the new file, never a part), and the trial table is recorded
next to it as ``tune-<time>.json``."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from services.durable import fsync_folder, replace_file
from services.gateway.tuning.candidates import Candidate, applied
from services.modelrepo.config import ConfigError, read_config, to_text
from services.modelrepo.layout import CONFIG_FILE, publish_lock

BACKUP_SUFFIX = ".bak-"
TABLE_PREFIX = "tune-"


@dataclass(frozen=True)
class Published:
    config: Path
    backup: Path
    table: Path

    def to_json(self) -> dict[str, str]:
        return {"config": str(self.config), "backup": str(self.backup), "table": str(self.table)}


class PublishError(Exception):
    """The config could not be published; nothing changed (the message says what happened)."""


def publish(repository: Path, model_dir: Path, winner: Candidate, table: dict[str, Any]) -> Published:
    """Blocking: call off the loop. The written config must read back as written (checked after the rename)."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"{time.time() % 1:.3f}"[1:].replace(".", "-")
    target = model_dir / CONFIG_FILE
    backup = model_dir / f"{CONFIG_FILE}{BACKUP_SUFFIX}{stamp}"
    table_path = model_dir / f"{TABLE_PREFIX}{stamp}.json"
    with publish_lock(repository):
        if not target.is_file():
            raise PublishError(f"{target} is gone; nothing was written")
        config = _tuned(model_dir, winner)
        text = to_text(config)
        _back_up(target, backup)
        replace_file(target, text.encode(), suffix=".partial")
        replace_file(table_path, (json.dumps(table, indent=2) + "\n").encode(), suffix=".partial")
        fsync_folder(model_dir)
    if read_config(model_dir) != config:  # what Triton and the gateway will read next
        raise PublishError(f"{target} does not read back as the config written; the old one is {backup}")
    return Published(target, backup, table_path)


def _back_up(target: Path, backup: Path) -> None:
    """``backup`` holds ``target``'s bytes and mode, durably: fsynced, and its folder entry too."""
    replace_file(backup, target.read_bytes(), suffix=".partial")
    shutil.copymode(target, backup)  # as readable as the config it keeps (a new file would be 0600)
    fsync_folder(backup.parent)


def _tuned(model_dir: Path, winner: Candidate) -> mc.ModelConfig:
    """The config on disk now (the catalog's copy may predate an edit made during the run) with the winner's
    settings."""
    try:
        return applied(read_config(model_dir), winner)
    except (ConfigError, ValueError) as exc:
        raise PublishError(f"{model_dir / CONFIG_FILE} was not replaced: {exc}") from None
