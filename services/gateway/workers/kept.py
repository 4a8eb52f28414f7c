"""The node's counters never go backwards: what a worker's process counted stays in the node's figures after the
process dies, or while it does not answer.

Every exposition a worker contributes to a node's ``/metrics`` (its own, or its answer to a peer's ``/peer/metrics``)
is first kept in the node's folder as ``figures/<index>-<pid>.prom``. A merge then adds, for every kept text whose
process did not answer this time, that text's counters, histograms and summaries: its last reported figures. Gauges
are left out of those (they describe a process that is gone, or silent). Once a process is gone for good its text is
folded into ``figures/retired.prom`` (under a lock: two workers answering scrapes at once fold each text once), so a
worker that crashes and restarts again and again leaves one file, not one per life. Without this, a restarted worker's
counts would vanish from the node's sums, and Prometheus would read the drop as a reset of every series it touched.

The statistics extension's figures are kept the same way (``kept_statistics.py``: ``<index>-<pid>.stats``); this
module holds what both kinds share.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

from services.gateway.workers.merge import cumulative, merge_metrics

RETIRED = "retired.prom"
_PARTIAL = ".partial"


def _unchanged(text: str) -> str:
    return text


class KeptTexts(ABC):
    """One kind of figures each process of the node reported, kept in the node's folder: a subclass names its files
    and says what of a text adds up over a process's life and how two such texts fold into one."""

    SUFFIX: ClassVar[str]
    RETIRED: ClassVar[str]

    def __init__(self, folder: Path, index: int, pid: int | None = None) -> None:
        self._folder = folder
        self._index = index
        self._pid = os.getpid() if pid is None else pid
        folder.mkdir(mode=0o700, exist_ok=True)

    @property
    def pid(self) -> int:
        return self._pid

    @abstractmethod
    def cumulative(self, text: str) -> str:
        """What of ``text`` adds up over a process's life (a gauge describes the process as it is now)."""

    @abstractmethod
    def fold(self, texts: list[str]) -> str:
        """One text counting what ``texts`` count together."""

    def keep(self, text: str) -> None:
        """This process's figures as they go into a node answer (replaced whole: a reader never sees half)."""
        _replace(self._folder / f"{self._index}-{self._pid}{self.SUFFIX}", text)

    def others(self, answered: set[int]) -> list[str]:
        """The cumulative figures of every kept process other than this one and those in ``answered`` (pids): the
        retired ones and the last report of each silent one."""
        return self._others(answered, _unchanged)

    def _others(self, answered: set[int], tidy: Callable[[str], str]) -> list[str]:
        """``others``, the retired figures passed through ``tidy`` (and kept so) before they are read."""
        texts = []
        with self._locked():
            gone = []
            for path, pid in self._kept():
                if pid == self._pid or pid in answered:
                    continue
                if _alive(pid):  # silent this time (busy, or stopping): its last report stands in for it
                    texts.append(self.cumulative(path.read_text()))
                else:
                    gone.append(path)
            retired = self._retire(gone, tidy)
        if retired:
            texts.append(retired)
        return texts

    def _kept(self) -> Iterator[tuple[Path, int]]:
        for path in self._folder.glob(f"*-*{self.SUFFIX}"):
            index, _, pid = path.name.removesuffix(self.SUFFIX).partition("-")
            if index.isdigit() and pid.isdigit():
                yield path, int(pid)

    def _retire(self, gone: list[Path], tidy: Callable[[str], str]) -> str:
        """Fold the texts of processes that are gone into the retired figures; those figures."""
        retired = self._folder / self.RETIRED
        before = retired.read_text() if retired.exists() else ""
        folded = before
        if gone:
            texts = [before] if before else []
            folded = self.fold(texts + [self.cumulative(path.read_text()) for path in gone])
        if folded:
            folded = tidy(folded)
        if folded != before:
            _replace(retired, folded)
        for path in gone:  # after the fold is in place: a crash in between counts them twice, never drops them
            path.unlink(missing_ok=True)
        return folded

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with (self._folder / ".lock").open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


class KeptFigures(KeptTexts):
    """Each process's last ``/metrics`` exposition."""

    SUFFIX = ".prom"
    RETIRED = RETIRED

    def cumulative(self, text: str) -> str:
        return cumulative(text)

    def fold(self, texts: list[str]) -> str:
        return merge_metrics(texts)


def _replace(path: Path, text: str) -> None:
    partial = path.with_name(path.name + _PARTIAL)  # per kind: a process keeps its .prom and .stats at once
    partial.write_text(text)
    partial.replace(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process holds the number now: ours is gone
        return False
    return True
