"""A batch's tensors: its requests' inputs merged along the batch dim for one run, the run's outputs checked to
hold a row per merged row, and sliced back to each caller (views, no copies)."""

from __future__ import annotations

import numpy as np

from services.gateway.batch_queue import QueuedRequest
from services.gateway.errors import InferenceFailed
from services.gateway.types import Array


def merge_inputs(batch: list[QueuedRequest]) -> dict[str, Array]:
    if len(batch) == 1:
        return dict(batch[0].inputs)
    return {name: np.concatenate([item.inputs[name] for item in batch]) for name in batch[0].inputs}


def check_rows(outputs: dict[str, Array], rows: int) -> None:
    """Refuse a run whose outputs do not have one row per merged row: slicing them back would misanswer callers."""
    for name, value in outputs.items():
        if value.ndim == 0 or value.shape[0] != rows:
            found = value.shape[0] if value.ndim else 0
            raise InferenceFailed(f"output '{name}' has {found} rows for a batch of {rows}")


def answer(batch: list[QueuedRequest], outputs: dict[str, Array]) -> None:
    """Each caller still waiting gets its own rows of every output."""
    if len(batch) == 1:
        if not batch[0].future.done():
            batch[0].future.set_result(outputs)
        return
    offset = 0
    for item in batch:
        if not item.future.done():
            item.future.set_result({name: value[offset : offset + item.rows] for name, value in outputs.items()})
        offset += item.rows
