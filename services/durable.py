"""Files replaced whole and made durable: readers see the old content or the new, never a part, and a rename is on
disk once its folder is. Used by the routing state file and by the tuner's config publish."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def replace_file(path: Path, data: bytes, *, prefix: str | None = None, suffix: str = ".tmp") -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync it and rename it over ``path``; the temporary
    file is removed on any failure. ``prefix``/``suffix`` name the temporary file (callers that clean up stale
    ones after a crash look for them). The folder is not fsynced: call ``fsync_folder`` when the rename must
    survive a power cut. Raises ``OSError``."""
    fd, temp = tempfile.mkstemp(prefix=prefix or f".{path.name}.", suffix=suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def fsync_folder(folder: Path) -> None:
    """A rename or a new file is durable only once its folder's entry is on disk."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
