"""Which version becomes a model's stable version when no routing state names one (a first boot, a fresh Redis, a
model that appears in the repository, a persisted stable version gone from disk): the highest *released* version
the config's ``version_policy`` selects, else the highest released version on disk (loaded beside the policy's
choice), else none. A version the exporter published unreleased (``--no-release``, the default for every version
but a model's first) is never made stable by a start: it serves unversioned requests only once activated."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from services.gateway.repository import ModelEntry


@dataclass(frozen=True)
class FirstStable:
    candidates: tuple[int, ...]
    """The versions the choice is made among, the highest that serves winning; empty when none is released."""
    rule: str
    """In words, for the startup log and the audit log: which rule chose, and what it passed over."""

    def pick(self, serving: Callable[[int], bool]) -> int | None:
        """The highest candidate that serves; the highest candidate when none does (its server is still down)."""
        ready = [v for v in self.candidates if serving(v)]
        return max(ready or self.candidates, default=None)


def first_stable(entry: ModelEntry) -> FirstStable:
    selected, released = entry.selected, set(entry.released)
    chosen = tuple(v for v in selected if v in released)
    passed = [v for v in selected if v not in released and (not chosen or v > max(chosen))]
    unreleased = f"{_versions(passed)} {'is' if len(passed) == 1 else 'are'} not released: activate to serve"
    if chosen:
        rule = "the highest released version the version policy selects"
        return FirstStable(chosen, f"{rule} ({unreleased})" if passed else rule)
    if released:
        latest = max(released)
        return FirstStable((latest,), f"the latest released version, beside the policy's {_versions(selected)} "
                                      f"(not released: activate to serve)")
    return FirstStable((), f"no version of it is released ({_versions(entry.available)}): activate one to serve "
                           "unversioned requests")


def _versions(versions: tuple[int, ...] | list[int]) -> str:
    return ("version " if len(versions) == 1 else "versions ") + ", ".join(str(v) for v in versions)
