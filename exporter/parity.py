"""The parity gate: eager PyTorch against the exported artifact on fresh inputs at batch 1, an odd size and
``max_batch_size``, each drawn several ways (``exporter.parity_draws``). An export that answers differently is
refused, with the likely causes in the order they are likely."""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch

from exporter.dtypes import as_numpy
from exporter.errors import DynamicBatchError, ModelError, ParityError, RowDependenceError
from exporter.module_io import PreparedModel
from exporter.parity_device import ON_CPU, ParityDevice, onnx_providers, onnx_started
from exporter.parity_draws import DRAWS, Stats, draw_inputs, like_example

if TYPE_CHECKING:
    import onnxruntime

Runner = Callable[[tuple[torch.Tensor, ...]], list[npt.NDArray[Any]]]

LOW_PRECISION = {torch.float16, torch.bfloat16}
DEFAULT_TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2}
ROUNDING_SCALE = 1e-2
"""Differences up to this fraction of an output's largest value can be rounding; beyond it, never suggest widening
the tolerance: that would publish a model that answers differently."""
SHOWN_FAILURES = 4


@dataclass(frozen=True)
class OutputParity:
    output: str
    batch_size: int
    max_abs_error: float
    max_rel_error: float
    atol: float
    rtol: float
    passed: bool
    draw: str = DRAWS[0].name
    """How the inputs were drawn (``exporter.parity_draws``)."""
    scaled_error: float = 0.0
    """``max_abs_error`` as a fraction of the largest expected value of the output."""
    expected_at_worst: float = 0.0
    """The expected value where the difference is largest: a relative difference means nothing where it is 0."""


@dataclass(frozen=True)
class ParityReport:
    batch_sizes: tuple[int, ...]
    """Per step, the batch size fed; one repeats where dynamic axes take more steps than there are batch sizes. 0 for
    a model without a batch dim (``max_batch_size=0``), fed whole tensors."""
    checks: tuple[OutputParity, ...]
    input_shapes: tuple[tuple[tuple[int, ...], ...], ...] = ()
    """Per batch size, the shape of each input fed: dynamic axes other than the batch axis differ between them."""
    draws: tuple[str, ...] = ()
    """The draws made at every batch size, in order."""
    device: str = "cpu"
    """Where the artifact ran (``cpu``, ``cuda:0``)."""
    device_note: str = ""
    """``ParityDevice.note``: for a GPU export, that it was checked on the GPU, or why on the CPU."""

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def max_abs_error(self) -> float:
        return max((c.max_abs_error for c in self.checks), default=0.0)

    @property
    def max_rel_error(self) -> float:
        return max((c.max_rel_error for c in self.checks), default=0.0)

    def as_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "batch_sizes": list(self.batch_sizes),
            "draws": list(self.draws),
            "max_abs_error": self.max_abs_error,
            "max_rel_error": self.max_rel_error,
            "checks": [asdict(c) for c in self.checks],
            "input_shapes": [[list(shape) for shape in step] for step in self.input_shapes],
            "device": self.device,
            "device_note": self.device_note,
        }

    def failures_text(self) -> str:
        failed = [c for c in self.checks if not c.passed]
        shown = "; ".join(_failure_text(c) for c in failed[:SHOWN_FAILURES])
        more = len(failed) - SHOWN_FAILURES
        return shown + (f"; and {more} more of {len(self.checks)} checks" if more > 0 else "")


def _failure_text(check: OutputParity) -> str:
    """One failed check in the tolerance's own terms: a difference is allowed up to atol + rtol * |expected|."""
    where = f"expected {check.expected_at_worst:.3g} there"
    if check.max_abs_error == float("inf") and math.isnan(check.expected_at_worst):
        where = "the shapes differ"
    elif check.expected_at_worst == 0:
        where = "expected 0 there, so only atol allows a difference"
    at = f"batch {check.batch_size}" if check.batch_size else "whole tensors (no batch dim)"
    return (f"{check.output} @ {at}, inputs {check.draw}: max abs {check.max_abs_error:.3g}, "
            f"{where} (tolerance atol={check.atol:g}, rtol={check.rtol:g}: |actual - expected| <= atol + rtol * "
            "|expected|)")


def parity_batch_sizes(max_batch_size: int) -> tuple[int, ...]:
    """Empty for a model without a batch dim (``max_batch_size=0``): its examples are fed at their own shapes."""
    if max_batch_size == 0:
        return ()
    odd = next((b for b in (7, 5, 3) if b < max_batch_size), 1)
    return tuple(sorted({1, odd, max_batch_size}))


GROWN_SIZES = 3
"""Sizes of each dynamic axis the gate checks (the example's, one more, two more): two sizes cannot tell an output
dim that follows the axis from one that rounds it (``L // 2`` is the same at 8 and 9)."""


def parity_steps(batch_sizes: Sequence[int], dynamic: bool) -> tuple[tuple[int, int], ...]:
    """The gate's runs as (batch size, growth of the dynamic axes): step ``i`` grows them by ``i``. With dynamic axes
    there are at least ``GROWN_SIZES`` steps, however few batch sizes there are (``max_batch_size=1`` has one),
    the extra steps cycling through the batch sizes; without, one step per batch size. No batch sizes (a model
    without a batch dim): steps of batch 0, the examples' own shapes, grown likewise."""
    if not batch_sizes:
        return tuple((0, step) for step in range(GROWN_SIZES if dynamic else 1))
    count = max(len(batch_sizes), GROWN_SIZES) if dynamic else len(batch_sizes)
    return tuple((batch_sizes[step % len(batch_sizes)], step if dynamic else 0) for step in range(count))


def default_tolerance(prepared: PreparedModel) -> float:
    dtypes = {t.dtype for t in (*prepared.examples, *prepared.reference_outputs)}
    dtypes |= {p.dtype for p in prepared.flat.parameters()}
    return DEFAULT_TOLERANCE["fp16"] if dtypes & LOW_PRECISION else DEFAULT_TOLERANCE["fp32"]


def random_like(
    example: torch.Tensor, batch: int, generator: torch.Generator, grow_axes: Sequence[int] = (), grow: int = 0
) -> torch.Tensor:
    """Fresh values at another batch size (and other sizes of ``grow_axes``), in the example's dtype and range."""
    return like_example(Stats.of(example), _shape(example, batch, grow_axes, grow), generator)


def check_parity(
    prepared: PreparedModel,
    run_exported: Runner,
    batch_sizes: Sequence[int],
    atol: float,
    rtol: float,
    seed: int = 1234,
    traced: str = "",
    dynamic_dims: Mapping[str, Sequence[int]] | None = None,
    device: ParityDevice = ON_CPU,
    merges_requests: bool = False,
) -> ParityReport:
    """``merges_requests``: the served model's dynamic batcher merges requests into one batch (max_batch_size > 1),
    so each row's answer must not depend on the other rows; checked on eager PyTorch at the largest batch, once the
    artifact matched (``check_rows_independent``). ``dynamic_dims`` (input name -> non-batch axes) are resized too,
    differently at each batch size. ``traced``
    says how a trace made the artifact, when one did: a frozen decision is then the first suspect. ``device``: where
    the runner runs; the inputs are drawn on the CPU (the same draws everywhere) and handed to eager PyTorch and the
    runner on ``device.eager``, where the caller has put ``prepared.flat`` (``parity_device.eager_on``)."""
    generator = torch.Generator().manual_seed(seed)
    stats = [Stats.of(t) for t in prepared.examples]
    dims = dynamic_dims or {}
    checks: list[OutputParity] = []
    shapes: list[tuple[tuple[int, ...], ...]] = []
    first_failure: tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]] | None = None
    steps = parity_steps(batch_sizes, any(dims.values()))
    largest = max(batch for batch, _ in steps)
    merged: list[tuple[str, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]] = []
    for batch, grow in steps:
        step_shapes = tuple(_shape(t, batch if prepared.batched else None, dims.get(name, ()), grow)
                            for name, t in zip(prepared.input_names, prepared.examples, strict=True))
        shapes.append(step_shapes)
        for draw in DRAWS:
            inputs = tuple(t.to(device.eager) for t in draw_inputs(draw, stats, step_shapes, generator))
            expected = _eager(prepared, inputs, batch)
            got = run_exported(inputs)
            new = [_compare(name, batch, ref, out, atol, rtol, draw.name)
                   for name, ref, out in zip(prepared.output_names, expected, got, strict=True)]
            checks.extend(new)
            if first_failure is None and not all(c.passed for c in new):
                first_failure = (inputs, expected)
            if merges_requests and batch == largest > 1 and len(merged) < len(DRAWS):
                merged.append((draw.name, inputs, expected))
    report = ParityReport(tuple(batch for batch, _ in steps), tuple(checks), tuple(shapes),
                          tuple(d.name for d in DRAWS), device.runtime, device.note)
    if first_failure is not None:
        raise ParityError(_failure_message(report, prepared, first_failure, traced))
    for draw_name, inputs, expected in merged:
        check_rows_independent(prepared, inputs, expected, atol, rtol, draw_name)
    return report


def check_rows_independent(
    prepared: PreparedModel,
    inputs: tuple[torch.Tensor, ...],
    expected: tuple[torch.Tensor, ...],
    atol: float,
    rtol: float,
    draw: str,
) -> None:
    """Refuse a model whose answer for a row depends on the other rows of its batch: ``expected`` (the batch's
    answers) against the same rows run in two requests, the first row alone and the others together, as a
    dynamic batcher may have split them. Eager PyTorch only: two more runs of rows the gate already ran."""
    batch = inputs[0].shape[0]
    parts = [_eager(prepared, tuple(t[start:stop] for t in inputs), stop - start)
             for start, stop in ((0, 1), (1, batch))]
    for index, name in enumerate(prepared.output_names):
        apart = torch.cat([part[index] for part in parts])
        check = _compare(name, batch, apart, as_numpy(expected[index].detach().cpu()), atol, rtol, draw)
        if not check.passed:
            raise RowDependenceError(
                f"output {name!r} of a row depends on the other rows of its batch: eager PyTorch answers a batch of "
                f"{batch} rows (inputs {draw}) differently from the same rows sent as two requests (the first row "
                f"alone, the other {batch - 1} together), by up to {check.max_abs_error:.3g} (tolerance atol="
                f"{atol:g}, rtol={rtol:g}). The served model's dynamic batcher merges requests from different clients "
                "into one batch, so each client's answer would depend on its neighbours'. Typical causes: an "
                "operation across the batch axis (softmax or a normalisation over dim 0, x.max(), x.mean(0) or "
                "x.sum() over the whole tensor), a batch norm using batch statistics (track_running_stats=False, or "
                "train mode forced in forward), an `if` on a whole-batch value. Ways out: make forward() row-wise "
                "(reduce over the other dims, e.g. dim=-1 with keepdim=True; running statistics), or export with "
                "max_batch_size=1 (--max-batch-size 1) so each request runs alone."
            )


def _shape(example: torch.Tensor, batch: int | None, grow_axes: Sequence[int], grow: int) -> tuple[int, ...]:
    """``batch``: ``None`` for a tensor without a batch axis, whose axis 0 grows only where it is dynamic."""
    return tuple(batch if axis == 0 and batch is not None else size + (grow if axis in grow_axes else 0)
                 for axis, size in enumerate(example.shape))


def _eager(prepared: PreparedModel, inputs: tuple[torch.Tensor, ...], batch: int) -> tuple[torch.Tensor, ...]:
    try:
        with torch.no_grad():
            expected = prepared.flat(*inputs)
    except Exception as exc:
        raise _raised(prepared, inputs, exc) from exc
    for name, ref in zip(prepared.output_names, expected, strict=True):
        if prepared.batched and (ref.dim() == 0 or ref.shape[0] != batch):
            raise DynamicBatchError(
                f"output {name!r} has shape {tuple(ref.shape)} in eager PyTorch for a batch of {batch}: its "
                "first axis is not the batch axis. Keep every output's dim 0 the batch (reshape with x.shape[0]), or "
                "export a model without a batch dim with max_batch_size=0."
            )
    return tuple(expected)


def _raised(prepared: PreparedModel, inputs: tuple[torch.Tensor, ...], error: Exception) -> ModelError:
    """forward() fails on inputs the served model must take: the parity gate feeds only sizes a client may send
    (a batch from 1 to max_batch_size, dynamic axes at other lengths than the example's) and values like the
    example's, so the served model would fail, or answer where eager PyTorch cannot, on such a request."""
    shapes = ", ".join(f"{name} {list(t.shape)} {str(t.dtype).removeprefix('torch.')}"
                       for name, t in zip(prepared.input_names, inputs, strict=True))
    raised = (f"the model's forward raised {type(error).__name__}: {str(error).strip()[:300]} — on inputs of shapes "
              f"{shapes}, which the parity gate fed it because a client may send them: the served model takes ")
    if not prepared.batched:  # no batch sizes: only the dynamic axes can have taken it past the example
        return ModelError(
            raised + "every length of a dynamic axis. Make forward() accept other lengths than the example's, or "
            "leave the axis out of dynamic_axes (its length then fixed at the example's)."
        )
    return ModelError(
        raised + "every batch size from 1 to max_batch_size and every length of a dynamic axis. Make forward() accept "
        "them (a batch of 1 included: batch statistics, squeeze() and .view() with fixed sizes fail there), or serve "
        "fewer sizes (a smaller max_batch_size, the axis left out of dynamic_axes)."
    )


def _failure_message(
    report: ParityReport,
    prepared: PreparedModel,
    failure: tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]],
    traced: str,
) -> str:
    inputs, expected = failure
    causes = []
    wavers = not _repeats(prepared, inputs, expected)
    if wavers:  # certain, so first
        causes.append(
            "forward() itself answers differently on the same inputs: randomness (torch.rand*, dropout or other "
            "train-mode behaviour in a custom layer) or Python-side state that changes between calls; make it "
            "deterministic in eval mode"
        )
    if traced:
        causes.append(
            f"{traced}, and a trace freezes data-dependent control flow (an `if` on values or on the batch size, "
            "len(x), .item(), loops over shapes) into the way the example went; keep the decision with torch.where / "
            "torch.cond, or make forward() scriptable"
        )
    if not wavers:
        causes.append(
            "randomness or train-mode layers in forward() (torch.rand*, a custom dropout, batch statistics), or "
            "Python-side state that changes between calls"
        )
    worst = max(c.scaled_error for c in report.checks if not c.passed)
    if worst <= ROUNDING_SCALE:
        causes.append(
            f"rounding: the largest difference is {worst:.2g} of the outputs' scale; if that is expected (reduced "
            "precision, a different kernel), widen atol/rtol"
        )
    else:
        causes.append(
            f"not rounding: the largest difference is {worst:.2g} of the outputs' scale, so widening atol/rtol "
            "would publish a model that answers differently"
        )
    listed = "; ".join(f"{i}) {cause}" for i, cause in enumerate(causes, 1))
    return (f"the exported model does not match eager PyTorch: {report.failures_text()}. Likely causes, most likely "
            f"first: {listed}.")


def _repeats(prepared: PreparedModel, inputs: tuple[torch.Tensor, ...], expected: tuple[torch.Tensor, ...]) -> bool:
    with torch.no_grad():
        again = prepared.flat(*inputs)
    return all(torch.equal(a, b) or (a.is_floating_point() and torch.allclose(a, b, rtol=0, atol=0, equal_nan=True))
               for a, b in zip(again, expected, strict=True))


def _compare(
    name: str, batch: int, ref: torch.Tensor, out: npt.NDArray[Any], atol: float, rtol: float, draw: str
) -> OutputParity:
    expected = ref.detach().cpu().double().numpy() if ref.is_floating_point() else as_numpy(ref)
    actual = np.asarray(out)
    if actual.shape != expected.shape:
        return OutputParity(name, batch, float("inf"), float("inf"), atol, rtol, False, draw, float("inf"),
                            float("nan"))
    a = actual.astype(np.float64)
    e = expected.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(a - e)
    same = (a == e) | (np.isnan(a) & np.isnan(e))  # equal infinities and NaN on both sides agree
    diff = np.where(same, 0.0, np.nan_to_num(diff, nan=np.inf))
    max_abs = float(diff.max()) if diff.size else 0.0
    worst = float(e.flat[int(np.argmax(diff))]) if diff.size else 0.0
    # Relative to a 0 the difference is a division by zero (1e+307 from the smallest float): only where it means
    # something, the elements whose expected value is not 0.
    nonzero = e != 0
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.where(nonzero, diff / np.where(nonzero, np.abs(e), 1.0), 0.0)
    max_rel = float(np.nan_to_num(rel, nan=np.inf).max()) if rel.size else 0.0
    passed = bool(np.all(diff <= atol + rtol * np.abs(np.nan_to_num(e))))
    finite = np.abs(e[np.isfinite(e)])
    scale = float(finite.max()) if finite.size else 0.0
    scaled = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    return OutputParity(name, batch, max_abs, max_rel, atol, rtol, passed, draw, scaled, worst)


def onnx_runner(path: Path, input_names: Sequence[str], device: ParityDevice = ON_CPU) -> tuple[Runner, ParityDevice]:
    """The artifact in onnxruntime on ``device``, and where it really runs (the CPU when CUDA would not start)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    # The gate alternates eager PyTorch and onnxruntime runs: threads left spinning after a run would take the cores
    # from the other engine's next one (eager PyTorch ran at half speed beside them).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(path), sess_options=options, providers=onnx_providers(device))
    bfloat16 = any(v.type == "tensor(bfloat16)" for v in (*session.get_inputs(), *session.get_outputs()))

    def run(inputs: tuple[torch.Tensor, ...]) -> list[npt.NDArray[Any]]:
        if bfloat16:
            return _run_bfloat16(session, input_names, inputs)
        feed = {n: t.detach().cpu().numpy() for n, t in zip(input_names, inputs, strict=True)}
        return list(session.run(None, feed))

    return run, onnx_started(device, list(session.get_providers()))


def torchscript_runner(path: Path, device: ParityDevice = ON_CPU) -> tuple[Runner, ParityDevice]:
    """The artifact loaded onto ``device.runtime`` (inputs arrive there from ``check_parity``)."""
    module = torch.jit.load(str(path), map_location=device.runtime)  # type: ignore[no-untyped-call]

    def run(inputs: tuple[torch.Tensor, ...]) -> list[npt.NDArray[Any]]:
        with torch.no_grad():
            out = module(*(t.to(device.runtime) for t in inputs))
        tensors = [out] if isinstance(out, torch.Tensor) else list(out)
        return [as_numpy(t) for t in tensors]

    return run, device


def _run_bfloat16(
    session: onnxruntime.InferenceSession, input_names: Sequence[str], inputs: tuple[torch.Tensor, ...]
) -> list[npt.NDArray[Any]]:
    """One run through ``OrtValue``s, which carry bfloat16 where numpy arrays cannot: a BF16 input goes in as its
    bit pattern, a BF16 output comes back as float32 (exact)."""
    import onnx
    import onnxruntime as ort

    on_cpu = [t.detach().cpu().contiguous() for t in inputs]
    arrays = [t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy() for t in on_cpu]
    feed = {
        # The OrtValue borrows the array's memory: ``arrays`` keeps it alive for the run.
        n: ort.OrtValue.ortvalue_from_numpy_with_onnx_type(a, onnx.TensorProto.BFLOAT16)
        if t.dtype == torch.bfloat16 else ort.OrtValue.ortvalue_from_numpy(a)
        for n, t, a in zip(input_names, inputs, arrays, strict=True)
    }
    results = []
    for value in session.run_with_ort_values(None, feed):
        if value.data_type() != "tensor(bfloat16)":
            results.append(value.numpy())
            continue
        shape = tuple(value.shape())
        count = int(np.prod(shape))
        # numpy has no bfloat16 for OrtValue.numpy() to return: copy the 2-byte bit patterns out and widen them.
        bits = np.frombuffer(ctypes.string_at(value.data_ptr(), 2 * count), dtype=np.int16).copy()
        results.append(as_numpy(torch.from_numpy(bits).view(torch.bfloat16).reshape(shape)))
    return results
