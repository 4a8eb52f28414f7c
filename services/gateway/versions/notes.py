"""What to know of a version that serves, beside its state: the admin API's ``note`` and the repository index's
reason. Two sources: the version's own warm-up (invented data that failed: it serves, but not fully warmed up), and
the model's config on a shared model server (an in-place tuning trial's config Triton did not take back), which holds
for every version that server loaded with it until the backend sends the model's own config again."""

from __future__ import annotations


class VersionNotes:
    def __init__(self) -> None:
        self._own: dict[tuple[str, int], str] = {}
        self._config: dict[str, tuple[frozenset[int], str]] = {}

    def warmed(self, model: str, version: int, note: str | None) -> None:
        """``version`` was warmed up: ``note`` says how it falls short (``None``: fully)."""
        if note is None:
            self._own.pop((model, version), None)
        else:
            self._own[model, version] = note

    def foreign_config(self, model: str, versions: frozenset[int], note: str) -> None:
        """The model server serves ``versions`` of ``model`` with a config not the model's own."""
        self._config[model] = (versions, note)

    def config_sent(self, model: str) -> None:
        """The model server serves what the gateway last sent it for ``model``: its own config, or nothing."""
        self._config.pop(model, None)

    def get(self, model: str, version: int) -> str | None:
        own = self._own.get((model, version))
        foreign = self._config.get(model)
        if foreign is None or version not in foreign[0]:
            return own
        return foreign[1] if own is None else f"{foreign[1]}; {own}"
