"""Helpers the exporter tests share."""

from __future__ import annotations

from pathlib import Path

from services.modelrepo.layout import EXPORT_LOGS_DIR, LOCK_FILE


def listing(root: Path) -> list[str]:
    """Every path under the repository, lock file and failed exports' logs excluded: what a polling server would
    see (a hidden folder is never a model)."""
    if not root.exists():
        return []
    return sorted(relative for relative in (p.relative_to(root).as_posix() for p in root.rglob("*"))
                  if relative != LOCK_FILE and relative.split("/")[0] != EXPORT_LOGS_DIR)
