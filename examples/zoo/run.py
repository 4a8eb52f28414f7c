"""Export every zoo model in every format and tabulate the outcome: the exporter that ran, the parity gate's
worst error at each batch / dynamic size it checked, the export time and the artifact's size."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from examples.zoo.catalog import FORMATS, ZOO, ZooModel
from exporter import ExportError, ExportResult, export
from exporter.model_config import artifact_name
from exporter.parity import ParityReport
from exporter.specs import Format

MAX_BATCH_SIZE = 8
"""Small, to keep the zoo quick: the gate checks batch 1, 7 and 8."""
COLUMNS = ("model", "format", "exporter", "parity: max abs error at batch/dynamic sizes", "export", "artifact")


@dataclass(frozen=True)
class ZooRow:
    model: ZooModel
    format: Format
    seconds: float
    result: ExportResult | None = None
    refusal: ExportError | None = None

    @property
    def served_name(self) -> str:
        return f"{self.model.name}_{self.format}"


def export_zoo(
    repository: str | Path,
    models: Iterable[ZooModel] = ZOO,
    formats: Sequence[Format] = FORMATS,
    progress: Callable[[ZooRow], None] | None = None,
) -> list[ZooRow]:
    """Export each model in each format as ``<model>_<format>``; a refusal is recorded, not raised."""
    rows = []
    for model in models:
        for fmt in formats:
            started = time.perf_counter()
            try:
                result = export(model.build(), model.example(), name=f"{model.name}_{fmt}", repository=repository,
                                format=fmt, max_batch_size=MAX_BATCH_SIZE, dynamic_axes=model.dynamic_axes)
                row = ZooRow(model, fmt, time.perf_counter() - started, result=result)
            except ExportError as refusal:
                row = ZooRow(model, fmt, time.perf_counter() - started, refusal=refusal)
            if progress:
                progress(row)
            rows.append(row)
    return rows


def problems(rows: Iterable[ZooRow]) -> list[str]:
    """Where the zoo departs from its catalog: an unexpected refusal, a refusal that does not name its cause,
    an expected refusal that exported after all, or a model that no format carries."""
    found = []
    carried: dict[str, bool] = {}
    for row in rows:
        expected = row.model.refused.get(row.format)
        carried[row.model.name] = carried.get(row.model.name, False) or row.result is not None
        if row.refusal is not None and expected is None:
            found.append(f"{row.served_name} was refused: {row.refusal}")
        elif row.refusal is not None and expected is not None and expected not in str(row.refusal):
            found.append(f"{row.served_name} was refused without naming {expected!r}: {row.refusal}")
        elif row.result is not None and expected is not None:
            found.append(f"{row.served_name} exported, but the catalog expects a refusal naming {expected!r}")
    found.extend(f"no format carries {name}" for name, ok in carried.items() if not ok)
    return found


def cells(row: ZooRow) -> tuple[str, ...]:
    if row.result is None:
        return (row.model.name, row.format, "refused", _cause(row.refusal), f"{row.seconds:.1f} s", "")
    size = (row.result.model_dir / artifact_name(row.format)).stat().st_size
    return (row.model.name, row.format, row.result.exporter, parity_text(row.result.parity), f"{row.seconds:.1f} s",
            f"{size / 1024:.0f} KiB")


def parity_text(report: ParityReport) -> str:
    """``7/9×9: 4.8e-07`` is the worst error over the outputs at batch 7 with dynamic sizes 9×9."""
    steps = []
    for batch, shapes in zip(report.batch_sizes, report.input_shapes, strict=True):
        worst = max(c.max_abs_error for c in report.checks if c.batch_size == batch)
        sizes = _dynamic_sizes(report.input_shapes, shapes)
        steps.append(f"{batch}{'/' + '×'.join(map(str, sizes)) if sizes else ''}: {worst:.1e}")
    return ", ".join(steps)


def _dynamic_sizes(
    every_step: Sequence[tuple[tuple[int, ...], ...]], step: tuple[tuple[int, ...], ...]
) -> tuple[int, ...]:
    """The sizes of the first input's non-batch axes that vary between steps (one input shows them all: the
    zoo's dynamic inputs grow together)."""
    for index, shape in enumerate(step):
        varying = [axis for axis in range(1, len(shape)) if len({s[index][axis] for s in every_step}) > 1]
        if varying:
            return tuple(shape[axis] for axis in varying)
    return ()


def _cause(refusal: ExportError | None) -> str:
    text = str(refusal)
    return f"{type(refusal).__name__}: {text[:text.find(' (')] if ' (' in text else text[:120]}"


def rich_table(rows: Iterable[ZooRow]) -> Table:
    table = Table(*COLUMNS, title="Exporter model zoo")
    for row in rows:
        table.add_row(*cells(row))
    return table


def markdown_table(rows: Iterable[ZooRow]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    lines += ["| " + " | ".join(cells(row)) + " |" for row in rows]
    return "\n".join(lines)
