"""Data-dependent control flow: how an export notices that ``forward`` decides on its inputs' values or batch
size, and the one error that explains it when no exporter can keep both ways of the decision.

A trace records the operations one run took, so an ``if`` on a tensor's value or on the batch size comes out as
the way the example went, and the parity gate only sees it if its inputs happen to go the other way. Three
signals say a decision is there before any number is compared:
- the tracer's warnings when a traced tensor becomes a Python bool, number or list, or ``len()`` or iteration
  reads a traced shape (each names the line of ``forward`` that did it);
- ``torch.export`` refusing to guard on a data-dependent expression;
- ``torch.export`` narrowing a dynamic axis (the ONNX exporter then quietly exports for the narrowed sizes only,
  e.g. a batch of 4 to 32 for ``if x.shape[0] > 3``).
"""

from __future__ import annotations

import contextlib
import linecache
import re
import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import sympy
import torch
from torch.export.graph_signature import InputKind
from torch.jit._trace import TracerWarning

from exporter.errors import DataDependentControlFlowError

_DECISION_WARNINGS = re.compile(
    r"^(Converting a tensor to a Python \w+|Using len to get tensor shape|Iterating over a tensor)"
)
_DATA_DEPENDENT_ERRORS = ("GuardOnDataDependentSymNode", "DataDependentOutputException")
_DATA_DEPENDENT_TEXT = ("data-dependent", "data dependent")

_TORCH_DIR = Path(torch.__file__).resolve().parent

AxisRange = tuple[int, int | None]
"""The sizes an axis was exported for: lowest and highest (``None``: unbounded)."""


class ScriptedConversionError(Exception):
    """Scripting took the model; the TorchScript-based ONNX exporter could not convert the scripted graph."""


@dataclass(frozen=True)
class Decision:
    """One place where the traced code turned a tensor into a Python value."""

    what: str
    """The tracer's words, e.g. ``Converting a tensor to a Python boolean``."""
    filename: str
    lineno: int

    @property
    def location(self) -> str:
        code = linecache.getline(self.filename, self.lineno).strip()
        return f"{self.filename}:{self.lineno}" + (f": {code}" if code else "")


@contextlib.contextmanager
def recorded_decisions() -> Iterator[list[Decision]]:
    """Collects the decisions the model's own code made in a trace inside the block; every warning caught is written
    to ``sys.stderr`` (the export's log while an export runs) so that nothing the exporters said is lost.

    Decisions inside torch itself do not count: its modules' shape checks and packed-sequence bookkeeping are
    what the exporters translate op by op (a traced GRU over packed sequences answers right at every length), and
    the parity gate still runs on what they produce."""
    found: list[Decision] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield found
        finally:
            for warning in caught:
                sys.stderr.write(warnings.formatwarning(
                    warning.message, warning.category, warning.filename, warning.lineno, warning.line))
                match = _DECISION_WARNINGS.match(str(warning.message))
                if issubclass(warning.category, TracerWarning) and match and not _in_torch(warning.filename):
                    decision = Decision(match.group(1), warning.filename, warning.lineno)
                    if decision not in found:
                        found.append(decision)


def traced_decisions(module: torch.nn.Module, examples: tuple[torch.Tensor, ...]) -> list[Decision]:
    """Trace ``module`` once only to see where it decides on data (the trace itself is thrown away)."""
    with recorded_decisions() as found, torch.no_grad(), contextlib.suppress(Exception):
        torch.jit.trace(module, examples, check_trace=False, strict=False)  # type: ignore[no-untyped-call]
    return found


def is_data_dependent(error: BaseException) -> bool:
    """Whether ``torch.export`` failed because the code branches on (or sizes by) a tensor's values."""
    seen: BaseException | None = error
    while seen is not None:
        if type(seen).__name__ in _DATA_DEPENDENT_ERRORS:
            return True
        if any(text in str(seen) for text in _DATA_DEPENDENT_TEXT):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


@dataclass(frozen=True)
class NarrowedAxis:
    """A dynamic axis ``torch.export`` exported for fewer sizes than asked."""

    axis: int
    text: str
    """Words for the user: which input, which axis, the sizes asked for and kept."""
    pinned: bool
    """Kept for one size alone (specialized to a constant), not a range."""


def narrowed_axes(
    program: torch.export.ExportedProgram, input_names: Sequence[str], requested: Mapping[str, Mapping[int, AxisRange]]
) -> list[NarrowedAxis]:
    """Each dynamic axis ``torch.export`` exported for fewer sizes than asked."""
    user_inputs = [spec.arg.name for spec in program.graph_signature.input_specs if spec.kind == InputKind.USER_INPUT]
    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    found: list[NarrowedAxis] = []
    for input_name, node_name in zip(input_names, user_inputs, strict=False):
        value = placeholders[node_name].meta.get("val")
        shape = getattr(value, "shape", None)
        if shape is None:
            continue
        for axis, (low, high) in requested.get(input_name, {}).items():
            size = shape[axis]
            wanted = f"{low}..{high if high is not None else 'any'}"
            if isinstance(size, int):
                found.append(NarrowedAxis(
                    axis, f"input {input_name!r} axis {axis} to size {size} alone (asked for {wanted})", pinned=True))
                continue
            bounds = program.range_constraints.get(size.node.expr)
            if bounds is None:  # an expression of other sizes (e.g. 2*s0): its symbols are checked on their own
                continue
            lower, upper = _bound(bounds.lower) or 0, _bound(bounds.upper)
            if lower > low or (high is not None and (upper is None or upper < high)) or (
                    high is None and upper is not None):
                got = f"{lower}..{upper if upper is not None else 'any'}"
                found.append(NarrowedAxis(
                    axis, f"input {input_name!r} axis {axis} to sizes {got} (asked for {wanted})", pinned=False))
    return found


def control_flow_error(
    decisions: Sequence[Decision],
    *,
    fmt: str,
    evidence: str,
    script_error: BaseException | None,
) -> DataDependentControlFlowError:
    """The refusal: where ``forward`` decides on data, why no exporter kept the decision, and the ways out."""
    locations = tuple(d.location for d in decisions)
    where = ("; ".join(f"{loc} ({_plain(d.what)})" for loc, d in zip(locations, decisions, strict=True))
             if decisions else "a line the tracer did not name")
    if script_error is None:
        keep = "scripting keeps the decision: export with format='torchscript' (--format torchscript)"
    elif isinstance(script_error, ScriptedConversionError) and script_error.__cause__ is not None:
        keep = (f"scripting keeps the decision but the ONNX exporter cannot convert the scripted model "
                f"({_first_line(script_error.__cause__)}): export with format='torchscript'")
    else:
        keep = (f"make forward scriptable so that torch.jit.script keeps the `if` (scripting said: "
                f"{_first_line(script_error)}), then export with format='torchscript'")
        if fmt == "onnx":
            keep += " or again as ONNX"
    return DataDependentControlFlowError(
        f"forward() decides on its inputs' values or batch size at {where}, and a trace would freeze the way the "
        f"example went into the {fmt} model ({evidence}). Ways out: compute both results and pick with "
        "torch.where(condition, a, b) (or torch.cond(pred, true_fn, false_fn, operands) for larger branches), which "
        f"every exporter keeps; {keep}; or move the decision out of the model into the client's pre/post-processing.",
        locations,
    )


def _in_torch(filename: str) -> bool:
    return Path(filename).resolve().is_relative_to(_TORCH_DIR)


def _bound(value: object) -> int | None:
    """A range end as an int, ``None`` for an infinite one (torch's integer infinity calls itself finite)."""
    if isinstance(value, int | sympy.Integer):
        return int(value)
    return None


def _plain(what: str) -> str:
    if what.startswith("Converting a tensor to a Python "):
        return "a tensor made a Python " + what.removeprefix("Converting a tensor to a Python ")
    return {"Using len to get tensor shape": "len() of a tensor", "Iterating over a tensor": "a loop over a tensor"
            }.get(what, what)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"[:300]
