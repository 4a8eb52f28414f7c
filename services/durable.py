"""Files replaced whole and made durable: readers see the old content or the new, never a part, and a rename is on
disk once its folder is. Used by the routing state file and by the tuner's config publish."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def replace_file(path: Path, data: bytes, *, prefix: str | None = None, suffix: str = ".tmp") -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync it and rename it over ``path``; the temporary
    file is removed on any failure. ``prefix``/``suffix`` name the temporary file (callers that clean up stale
    ones after a crash look for them). The folder is not fsynced: call ``fsync_folder`` when the rename must
    survive a power cut. A file replaced keeps its permission bits and, where this user may set it, its group: an
    operator who made the keys file readable to the gateway's own user (0640, its group) must not find it 0600 and
    owned by whoever ran the last command (mkstemp's mode, which a new file gets). Raises ``OSError``."""
    fd, temp = tempfile.mkstemp(prefix=prefix or f".{path.name}.", suffix=suffix, dir=path.parent)
    try:
        _keep_access(fd, path)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _keep_access(fd: int, path: Path) -> None:
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return
    os.fchmod(fd, found.st_mode & 0o7777)
    if found.st_gid != os.getegid():
        with contextlib.suppress(PermissionError):  # not a group of this user's: the mode is kept, the group not
            os.fchown(fd, -1, found.st_gid)


def fsync_folder(folder: Path) -> None:
    """A rename or a new file is durable only once its folder's entry is on disk."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
