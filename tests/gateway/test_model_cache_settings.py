"""The model cache's settings are refused at startup when they cannot mean anything, naming the variable."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from services.gateway.settings import Settings, pinned


@pytest.mark.parametrize(
    ("changes", "complaint"),
    [
        ({"model_cache_mb": 0}, "SWITCHYARD_MODEL_CACHE_MB must be more than 0 (MiB), got 0"),
        ({"model_cache_mb": -5}, "SWITCHYARD_MODEL_CACHE_MB must be more than 0 (MiB), got -5"),
        ({"model_cache_mb": float("nan")}, "SWITCHYARD_MODEL_CACHE_MB must be more than 0 (MiB), got nan"),
        ({"model_cache_mb": 100, "model_min_residency_s": -1}, "SWITCHYARD_MODEL_MIN_RESIDENCY_S must be 0 or more"),
        ({"model_cache_mb": 100, "model_idle_unload_s": -0.5}, "SWITCHYARD_MODEL_IDLE_UNLOAD_S must be 0 or more"),
        ({"pinned_models": "mlp"}, "SWITCHYARD_PINNED_MODELS needs SWITCHYARD_MODEL_CACHE_MB"),
    ],
)
def test_model_cache_settings_that_mean_nothing_are_refused_naming_the_variable(
    tmp_path: Path, changes: dict[str, object], complaint: str
) -> None:
    with pytest.raises(ValidationError, match=complaint.replace("(", r"\(").replace(")", r"\)")):
        Settings(repository=tmp_path, **changes)  # type: ignore[arg-type]


def test_pinned_models_are_read_as_names_with_spaces_and_empty_entries_dropped(tmp_path: Path) -> None:
    settings = Settings(repository=tmp_path, model_cache_mb=100, pinned_models=" mlp, ,classifier ,")
    assert pinned(settings) == {"mlp", "classifier"}
