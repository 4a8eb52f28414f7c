"""The parity gate: eager PyTorch against the exported artifact on fresh random inputs at
batch 1, an odd size and ``max_batch_size``. An export that answers differently is refused."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from exporter.errors import DynamicBatchError, ParityError
from exporter.module_io import PreparedModel

Runner = Callable[[tuple[torch.Tensor, ...]], list[npt.NDArray[Any]]]

LOW_PRECISION = {torch.float16, torch.bfloat16}
DEFAULT_TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2}


@dataclass(frozen=True)
class OutputParity:
    output: str
    batch_size: int
    max_abs_error: float
    max_rel_error: float
    atol: float
    rtol: float
    passed: bool


@dataclass(frozen=True)
class ParityReport:
    batch_sizes: tuple[int, ...]
    checks: tuple[OutputParity, ...]
    input_shapes: tuple[tuple[tuple[int, ...], ...], ...] = ()
    """Per batch size, the shape of each input fed: dynamic axes other than the batch axis differ between them."""

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
            "max_abs_error": self.max_abs_error,
            "max_rel_error": self.max_rel_error,
            "checks": [asdict(c) for c in self.checks],
            "input_shapes": [[list(shape) for shape in step] for step in self.input_shapes],
        }

    def failures_text(self) -> str:
        return "; ".join(
            f"{c.output} @ batch {c.batch_size}: max abs {c.max_abs_error:.3g}, max rel {c.max_rel_error:.3g} "
            f"(tolerance atol={c.atol:g}, rtol={c.rtol:g})"
            for c in self.checks if not c.passed
        )


def parity_batch_sizes(max_batch_size: int) -> tuple[int, ...]:
    odd = next((b for b in (7, 5, 3) if b < max_batch_size), 1)
    return tuple(sorted({1, odd, max_batch_size}))


def default_tolerance(prepared: PreparedModel) -> float:
    dtypes = {t.dtype for t in (*prepared.examples, *prepared.reference_outputs)}
    dtypes |= {p.dtype for p in prepared.flat.parameters()}
    return DEFAULT_TOLERANCE["fp16"] if dtypes & LOW_PRECISION else DEFAULT_TOLERANCE["fp32"]


def random_like(
    example: torch.Tensor, batch: int, generator: torch.Generator, grow_axes: Sequence[int] = (), grow: int = 0
) -> torch.Tensor:
    """Fresh values at another batch size (and other sizes of ``grow_axes``), in the example's dtype and range."""
    shape = tuple(batch if axis == 0 else size + (grow if axis in grow_axes else 0)
                  for axis, size in enumerate(example.shape))
    if example.dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if not example.is_floating_point():
        low, high = int(example.min()), int(example.max())
        return torch.randint(low, high + 1, shape, generator=generator, dtype=example.dtype)
    as_float = example.double()
    std = float(as_float.std()) if example.numel() > 1 else 1.0
    mean = float(as_float.mean())
    values = torch.randn(shape, generator=generator, dtype=torch.float64) * (std or 1.0) + mean
    return values.to(example.dtype)


def check_parity(
    prepared: PreparedModel,
    run_exported: Runner,
    batch_sizes: Sequence[int],
    atol: float,
    rtol: float,
    seed: int = 1234,
    hint: str = "",
    dynamic_dims: Mapping[str, Sequence[int]] | None = None,
) -> ParityReport:
    """``dynamic_dims`` (input name -> non-batch axes) are resized too, differently at each batch size."""
    generator = torch.Generator().manual_seed(seed)
    checks: list[OutputParity] = []
    shapes: list[tuple[tuple[int, ...], ...]] = []
    dims = dynamic_dims or {}
    for step, batch in enumerate(batch_sizes):
        inputs = tuple(random_like(t, batch, generator, dims.get(name, ()), grow=step)
                       for name, t in zip(prepared.input_names, prepared.examples, strict=True))
        shapes.append(tuple(tuple(t.shape) for t in inputs))
        with torch.no_grad():
            expected = prepared.flat(*inputs)
        for name, ref in zip(prepared.output_names, expected, strict=True):
            if ref.dim() == 0 or ref.shape[0] != batch:
                raise DynamicBatchError(
                    f"output {name!r} has shape {tuple(ref.shape)} in eager PyTorch for a batch of {batch}: its "
                    "first axis is not the batch axis. Keep every output's dim 0 the batch (reshape with x.shape[0])."
                )
        got = run_exported(inputs)
        for name, ref, out in zip(prepared.output_names, expected, got, strict=True):
            checks.append(_compare(name, batch, ref, out, atol, rtol))
    report = ParityReport(tuple(batch_sizes), tuple(checks), tuple(shapes))
    if not report.passed:
        raise ParityError(
            f"the exported model does not match eager PyTorch: {report.failures_text()}. "
            + (hint or "Check for randomness or Python-side state in forward(), or widen the tolerance "
               "(atol/rtol) if the difference is expected.")
        )
    return report


def _compare(name: str, batch: int, ref: torch.Tensor, out: npt.NDArray[Any], atol: float, rtol: float) -> OutputParity:
    expected = ref.detach().cpu().double().numpy() if ref.is_floating_point() else ref.cpu().numpy()
    actual = np.asarray(out)
    if actual.shape != expected.shape:
        return OutputParity(name, batch, float("inf"), float("inf"), atol, rtol, False)
    a = actual.astype(np.float64)
    e = expected.astype(np.float64)
    diff = np.abs(a - e)
    both_nan = np.isnan(a) & np.isnan(e)
    diff = np.where(both_nan, 0.0, diff)
    max_abs = float(np.nan_to_num(diff, nan=np.inf).max()) if diff.size else 0.0
    rel = diff / np.maximum(np.abs(e), np.finfo(np.float64).tiny)
    max_rel = float(np.nan_to_num(rel, nan=np.inf).max()) if rel.size else 0.0
    passed = bool(np.all(np.nan_to_num(diff, nan=np.inf) <= atol + rtol * np.abs(np.nan_to_num(e))))
    return OutputParity(name, batch, max_abs, max_rel, atol, rtol, passed)


def onnx_runner(path: Path, input_names: Sequence[str]) -> Runner:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])

    def run(inputs: tuple[torch.Tensor, ...]) -> list[npt.NDArray[Any]]:
        feed = {n: t.detach().cpu().numpy() for n, t in zip(input_names, inputs, strict=True)}
        return list(session.run(None, feed))

    return run


def torchscript_runner(path: Path) -> Runner:
    module = torch.jit.load(str(path), map_location="cpu")  # type: ignore[no-untyped-call]

    def run(inputs: tuple[torch.Tensor, ...]) -> list[npt.NDArray[Any]]:
        with torch.no_grad():
            out = module(*inputs)
        tensors = [out] if isinstance(out, torch.Tensor) else list(out)
        return [t.detach().cpu().numpy() for t in tensors]

    return run
