"""The versioned Triton model repository: version numbering and atomic publication.

A version is assembled in a hidden staging folder inside the repository (same filesystem) and
moved into place with one ``rename``, so a server polling the repository never sees a
half-written version, and a failed or killed export leaves no version folder behind.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from exporter.errors import RepositoryError
from exporter.specs import validate_model_name
from services.modelrepo.layout import (
    CONFIG_FILE,
    EXPORT_LOGS_DIR,
    STAGING_PREFIX,
    WARMUP_DIR,
    is_version_name,
    publish_lock,
)

KEPT_LOGS = 20
"""Failed exports' logs kept in the repository's log folder, newest first."""


class ModelRepository:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def model_dir(self, name: str) -> Path:
        return self.root / validate_model_name(name)

    def versions(self, name: str) -> list[int]:
        """Every folder named as a version (``layout.is_version_name``), not only those ``layout.versions`` would
        serve: a folder without its model file (being copied in, hand-made, half broken) still owns its number, so
        the next export numbers past it instead of colliding with it or with whoever is still writing it."""
        directory = self.model_dir(name)
        if not directory.is_dir():
            return []
        return sorted(int(p.name) for p in directory.iterdir() if p.is_dir() and is_version_name(p.name))

    def next_version(self, name: str) -> int:
        return max(self.versions(name), default=0) + 1

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Serialise publishers (several exports into one repository, a gateway rescanning it)."""
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(publish_lock(self.root))
            except OSError as exc:
                raise self.unwritable_error(exc) from exc
            yield

    @contextlib.contextmanager
    def staging(self) -> Iterator[Path]:
        """A private folder inside the repository, removed whatever happens."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self._remove_abandoned_staging()
            path = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=self.root))
        except OSError as exc:
            raise self.unwritable_error(exc) from exc
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def publish(
        self,
        name: str,
        version: int,
        staged_version: Path,
        config_text: str,
        warmup: Mapping[str, bytes],
    ) -> Path:
        """Move a fully written version folder into place and update the model's shared files.

        Call under ``locked()``. The version folder appears in one rename; ``config.pbtxt`` and the
        warmup files are replaced one by one with ``os.replace``, each atomic.
        """
        try:
            return self._publish(name, version, staged_version, config_text, warmup)
        except OSError as exc:
            raise self.unwritable_error(exc) from exc

    def unwritable_error(self, exc: OSError) -> RepositoryError:
        """The refusal for an I/O failure while writing into the repository (a file in its place, no permission,
        a full disk)."""
        if self.root.exists() and not self.root.is_dir():
            reason = "it is a file, not a folder"
        else:
            reason = f"{exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else "")
        return RepositoryError(
            f"cannot write to the model repository {self.root}: {reason}. Point repository= (--repository) at a "
            "folder you can write to, or at a path where one can be created, with free space."
        )

    def _publish(
        self,
        name: str,
        version: int,
        staged_version: Path,
        config_text: str,
        warmup: Mapping[str, bytes],
    ) -> Path:
        model_dir = self.model_dir(name)
        target = model_dir / str(version)
        if target.exists():
            raise RepositoryError(
                f"version {version} of model {name!r} already exists at {target}; omit the version to "
                "write the next free one, or pick an unused number"
            )
        staging = staged_version.parent
        (staging / CONFIG_FILE).write_text(config_text)
        warmup_dir = staging / WARMUP_DIR
        warmup_dir.mkdir(exist_ok=True)
        for file_name, data in warmup.items():
            (warmup_dir / file_name).write_bytes(data)
        _fsync_tree(staging)
        if not model_dir.exists():
            new_model = staging / "model"
            new_model.mkdir()
            os.rename(staged_version, new_model / str(version))
            os.rename(staging / CONFIG_FILE, new_model / CONFIG_FILE)
            os.rename(warmup_dir, new_model / WARMUP_DIR)
            os.rename(new_model, model_dir)
            return target
        os.rename(staged_version, target)
        try:
            (model_dir / WARMUP_DIR).mkdir(exist_ok=True)
            for file_name in warmup:
                os.replace(warmup_dir / file_name, model_dir / WARMUP_DIR / file_name)
            os.replace(staging / CONFIG_FILE, model_dir / CONFIG_FILE)
        except OSError:
            shutil.rmtree(target, ignore_errors=True)
            raise
        return target

    def keep_log(self, log: Path, name: str) -> Path | None:
        """Move a failed export's log out of its staging folder (which is removed) into the repository's hidden
        log folder, keeping the newest ``KEPT_LOGS``; ``None`` when the exporters said nothing."""
        if not log.is_file() or log.stat().st_size == 0:
            return None
        logs = self.root / EXPORT_LOGS_DIR
        logs.mkdir(exist_ok=True)
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        kept = logs / f"{name}-{stamp}-{os.getpid()}.log"
        os.replace(log, kept)
        for old in sorted(logs.glob("*.log"), key=lambda p: p.stat().st_mtime)[:-KEPT_LOGS]:
            old.unlink(missing_ok=True)
        return kept

    def _remove_abandoned_staging(self) -> None:
        # A publisher killed mid-export leaves its staging folder; its PID in the name tells if it is gone.
        for path in self.root.glob(f"{STAGING_PREFIX}*"):
            pid_text = path.name.removeprefix(STAGING_PREFIX).split("-", 1)[0]
            if pid_text.isdigit() and not _alive(int(pid_text)):
                shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())


def sha256_files(directory: Path) -> dict[str, str]:
    digests = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        digests[path.relative_to(directory).as_posix()] = digest.hexdigest()
    return digests
