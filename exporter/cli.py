"""``switchyard export``: build a module from an importable factory and publish the next version.

The command is registered on every install, serving nodes included; it imports the exporter's toolchain
(the ``export`` extra) only when it runs, and without it ends with one line naming the extra.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TextIO

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from exporter.errors import ExportError, InvalidSpecError
from exporter.specs import DEFAULT_INSTANCES, DEFAULT_QUEUE_DELAY_US, TensorSpec
from services.extras import MissingExtra, require

if TYPE_CHECKING:
    from exporter.api import ExportResult

TOOLCHAIN = ("torch", "onnx", "onnxscript")
"""What the ``export`` extra installs and an export imports (onnxruntime is in the base install)."""
MISSING_EXTRA_EXIT = 2
DEFAULT_EXAMPLE_BATCH = 2
STAGE_LABELS = {
    "export": "export the module",
    "check": "load the artifact",
    "parity": "parity against eager PyTorch",
    "publish": "publish the version",
}


def register(app: typer.Typer) -> None:
    app.command("export")(export_command)


def export_command(
    factory: Annotated[str, typer.Argument(help="MODULE:FACTORY returning an nn.Module, or (module, example_inputs).")],
    name: Annotated[str, typer.Option(help="Model name in the repository.")],
    repository: Annotated[Path, typer.Option(help="Triton model repository.")] = Path("model_repository"),
    format: Annotated[str, typer.Option("--format", help="onnx or torchscript.")] = "onnx",
    inputs: Annotated[list[str] | None, typer.Option(
        "--input", metavar="NAME:DTYPE:SHAPE",
        help="One input, SHAPE without the batch dim, -1 for dynamic dims, e.g. image:FP32:3,64,64; repeat it for "
             "each input (--input a:FP32:4 --input b:FP32:4).",
    )] = None,
    outputs: Annotated[list[str] | None, typer.Option(
        "--output", metavar="NAME",
        help="Name of the model's next output, in the order forward() returns them, e.g. logits; repeat it for each "
             "output.",
    )] = None,
    max_batch_size: Annotated[int, typer.Option(
        help="Largest batch the model accepts; 0: the model has no batch dim (--input shapes are whole shapes, no "
             "dynamic batcher).",
    )] = 32,
    version: Annotated[int | None, typer.Option(help="Version to write (default: the next free one).")] = None,
    instances: Annotated[int, typer.Option(help="instance_group count.")] = DEFAULT_INSTANCES,
    kind: Annotated[str, typer.Option(help="instance_group kind: cpu or gpu.")] = "cpu",
    version_policy: Annotated[str, typer.Option(help="latest:N, all or specific:1,2.")] = "latest:1",
    max_queue_delay_us: Annotated[int | None, typer.Option(
        help=f"Dynamic batcher queue delay (default: {DEFAULT_QUEUE_DELAY_US}).", show_default=False,
    )] = None,
    preferred_batch_size: Annotated[list[int] | None, typer.Option(
        metavar="N", help="A preferred batch size of the dynamic batcher; repeat it for more "
                          "(--preferred-batch-size 4 --preferred-batch-size 8).",
    )] = None,
    priority_levels: Annotated[int, typer.Option(
        help="Priority levels of the dynamic batcher (requests name 1 = highest .. N; 0: none)."
    )] = 0,
    example_batch: Annotated[int | None, typer.Option(
        help="Batch size of the generated example inputs (default: 2, or 1 when --max-batch-size is 1; none with "
             "--max-batch-size 0).",
        show_default=False,
    )] = None,
    atol: Annotated[float | None, typer.Option(help="Parity tolerance, absolute.")] = None,
    rtol: Annotated[float | None, typer.Option(help="Parity tolerance, relative.")] = None,
    release: Annotated[bool | None, typer.Option(
        "--release/--no-release", show_default=False,
        help="Whether a gateway starting with no routing state may serve this version by itself (default: only "
             "a model's first version; later ones serve once activated).",
    )] = None,
    debug: Annotated[bool, typer.Option(
        help="Show Python tracebacks and the exporters' own output (graphs, warnings) as it comes."
    )] = False,
) -> None:
    """Export a PyTorch model, prove it matches eager PyTorch, and write it as a new version."""
    _require_toolchain(debug)
    # Imported only now: the pipeline pulls torch and onnx, which a serving node does not have.
    from exporter.api import STAGES, export
    from exporter.factory import build, dynamic_axes

    console = Console(file=_own_stderr())
    try:
        rows = _example_rows(example_batch, max_batch_size)
        module, examples, input_names = build(factory, inputs or [], rows)
        axes = dynamic_axes(inputs or [], batched=max_batch_size != 0)
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                      console=console, transient=False) as progress:
            tasks = {s: progress.add_task(STAGE_LABELS[s], total=1, start=False) for s in STAGES}
            current: list[str] = []

            def advance(stage: str) -> None:
                if current:
                    progress.update(tasks[current[-1]], completed=1)
                progress.start_task(tasks[stage])
                current.append(stage)

            result = export(
                module, examples, name=name, repository=repository, format=format,  # type: ignore[arg-type]
                max_batch_size=max_batch_size, version=version, input_names=input_names, output_names=outputs or None,
                dynamic_axes=axes or None, instances=instances, kind=kind,  # type: ignore[arg-type]
                version_policy=version_policy, max_queue_delay_us=max_queue_delay_us,
                preferred_batch_sizes=preferred_batch_size or (), priority_levels=priority_levels,
                atol=atol, rtol=rtol, release=release, progress=advance, verbose=debug,
            )
            progress.update(tasks[current[-1]], completed=1)
    except ExportError as exc:
        if debug:
            raise
        console.print(f"[bold red]export failed:[/] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    Console().print(summary_table(result))
    if result.config_changes:
        # Every version shares config.pbtxt: options left at their defaults replace what an earlier export set.
        typer.echo(f"config.pbtxt changed for every version of {result.name}:")
        for change in result.config_changes:
            typer.echo(f"  {change}")
    if not result.released:
        typer.echo(f"version {result.version} is not released: it serves unversioned requests once activated "
                   f"(switchyard models activate {result.name} {result.version})")


def _example_rows(example_batch: int | None, max_batch_size: int) -> int | None:
    """The rows of the generated example inputs; ``None`` for a model without a batch dim (``--max-batch-size 0``),
    whose inputs are generated at their whole ``--input`` shapes."""
    if max_batch_size != 0:
        # Two rows show more of the model than one, but never more than the model may take.
        return example_batch if example_batch is not None else max(1, min(DEFAULT_EXAMPLE_BATCH, max_batch_size))
    if example_batch is not None:
        raise InvalidSpecError(
            f"--example-batch {example_batch} gives the rows of a batch, but --max-batch-size 0 exports a model "
            "without a batch dim: leave --example-batch out (the --input shapes are the whole shapes the model takes), "
            "or give --max-batch-size 1 or more"
        )
    return None


def _own_stderr() -> TextIO:
    """stderr on a descriptor of its own: while an export runs, descriptor 2 leads to the export's log, and the
    progress display must still reach the terminal."""
    try:
        return open(os.dup(sys.stderr.fileno()), "w", buffering=1, encoding="utf-8", errors="replace")  # noqa: SIM115
    except (AttributeError, OSError, ValueError):  # not a real file (a test runner's buffer): nothing redirects it
        return sys.stderr


def _require_toolchain(debug: bool) -> None:
    """Without the ``export`` extra: one line naming it and exit 2, not an ImportError's traceback."""
    try:
        for module in TOOLCHAIN:
            require(module, extra="export", feature="switchyard export")
    except MissingExtra as exc:
        if debug:
            raise
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(MISSING_EXTRA_EXIT) from None


def _dims_text(spec: TensorSpec) -> str:
    served = str(list(spec.dims))
    return served if spec.reshape is None else f"{served} (model: {list(spec.reshape)})"


def _parity_text(result: ExportResult) -> str:
    sizes = sorted(set(result.parity.batch_sizes))
    if sizes and sizes != [0]:
        return f"parity at batch sizes {sizes}"
    # No batch dim: the whole tensors fed, one set of shapes per step (dynamic axes grow between them).
    steps = ["; ".join(f"{spec.name} {list(shape)}" for spec, shape in zip(result.inputs, step, strict=True))
             for step in result.parity.input_shapes]
    return f"parity without a batch dim, at shapes {' | '.join(steps)}"


def summary_table(result: ExportResult) -> Table:
    table = Table(title=f"{result.name} version {result.version} → {result.model_dir}", title_justify="left")
    for column in ("tensor", "datatype", "dims", "max abs err", "max rel err", "atol / rtol"):
        table.add_column(column, overflow="fold")  # at 80 columns a cell wraps, never loses its end to "…"
    worst: dict[str, tuple[float, float, str]] = {}
    for check in result.parity.checks:
        prev = worst.get(check.output, (0.0, 0.0, ""))
        worst[check.output] = (max(prev[0], check.max_abs_error), max(prev[1], check.max_rel_error),
                               f"{check.atol:g} / {check.rtol:g}")
    for spec in result.inputs:
        table.add_row(f"in  {spec.name}", spec.datatype, _dims_text(spec), "", "", "")
    for (spec, (abs_err, rel_err, tol)) in zip(result.outputs, worst.values(), strict=True):
        table.add_row(f"out {spec.name}", spec.datatype, _dims_text(spec), f"{abs_err:.2e}", f"{rel_err:.2e}", tol)
    parity = _parity_text(result)
    where = [result.parity.device_note] if result.parity.device_note else []  # a CPU export's caption is unchanged
    table.caption = "; ".join([f"{result.format} via {result.exporter}", parity, *where, *result.notes])
    return table
