"""Helpers the exporter tests share."""

from __future__ import annotations

from pathlib import Path

from services.modelrepo.layout import LOCK_FILE


def listing(root: Path) -> list[str]:
    """Every path under the repository, lock file excluded: what a polling server would see."""
    if not root.exists():
        return []
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.name != LOCK_FILE)
