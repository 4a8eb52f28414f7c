"""Comparing logged answers with new ones: what ``switchyard replay`` and an activation's replay check report.

Per output: the largest |new - logged|, how many values fail ``numpy.isclose(new, logged, atol, rtol)``, and for a
classifier-like output (float, last dimension over 1) how many rows changed their argmax; BYTES outputs are equal or
not, except an output the request asked a class count of (``score:index[:label]`` entries, top classes first): there
each logged class must be among the new answer's classes of its row with a score within the tolerances, and a row
whose top class changed counts as an argmax change. A request that failed when it was logged (no answer) is compared
on its status only. A record whose inputs were truncated or redacted cannot be re-sent, and a shadow copy's answer
never reached a client: they are skipped, and the report says how many and why. The report passes when at least one
answer was compared and none differed beyond the tolerances, and no status differed; an argmax change within the
tolerances is reported, never a failure (two near-equal scores may swap places).

Imports numpy, the standard library, ``format`` and ``sources``: the ops CLI imports it inside its command."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from services.inferlog.format import BF16, RecordError, inputs_of, output_parameters_of, outputs_of, parameters_of
from services.inferlog.sources import shown

__all__ = ["NOT_RESENDABLE", "SHADOW_COPY", "Answer", "OutputFigures", "ReplayReport", "render_report", "resendable"]

WIDTH = 80
"""The text rendering fits a terminal of this many columns."""
SHOWN_MISMATCHES = 10
"""Status mismatches listed by request id in the report (the count is always whole)."""
NOT_RESENDABLE = "inputs not in the log"
SHADOW_COPY = "shadow copies (the shadow version's answers, never sent to a client)"
CLASSIFICATION = "classification"
"""The output parameter of a class count (``format.output_parameters_of``)."""


@dataclass(frozen=True)
class Answer:
    """What the replayed request got: its HTTP status, its outputs (empty on failure), the error text, its latency."""

    status: int
    outputs: dict[str, npt.NDArray[Any]]
    latency_ms: float
    error: str | None = None


@dataclass
class OutputFigures:
    """One output over every compared answer."""

    compared: int = 0
    """Answers in which both sides had this output."""
    max_abs_diff: float = 0.0
    values_off: int = 0
    """Values beyond the tolerances (for BYTES: strings that differ)."""
    answers_off: int = 0
    """Answers with at least one value beyond the tolerances, or a shape or presence that differs."""
    argmax_changed: int = 0
    """Rows whose argmax differs (classifier-like outputs only)."""
    problems: Counter[str] = field(default_factory=Counter)
    """Why the output could not be compared value by value (missing, another shape), with how often."""

    def to_json(self) -> dict[str, Any]:
        return {
            "compared": self.compared,
            "max_abs_diff": self.max_abs_diff if math.isfinite(self.max_abs_diff) else "not finite",
            "values_off": self.values_off,
            "answers_off": self.answers_off,
            "argmax_changed": self.argmax_changed,
            "problems": dict(self.problems),
        }


@dataclass
class ReplayReport:
    """Logged answers of ``model`` against ``version``'s new ones; ``add`` one pair at a time, ``skip`` the rest."""

    model: str
    version: int
    atol: float
    rtol: float
    source: str = ""
    """Where the records were read; kept without a password (``sources.shown``): the report goes to the audit log,
    the admin API and a script's output."""
    records: int = 0
    """Records read for the model (compared, skipped or status-only)."""
    compared: int = 0
    """Records whose answer was compared value by value."""
    status_only: int = 0
    """Records logged as failures (no answer to compare): compared on their status only."""
    differing: int = 0
    """Compared records with an output beyond the tolerances (status mismatches are counted apart)."""
    status_mismatches: list[dict[str, Any]] = field(default_factory=list)
    """``{"id", "logged", "new", "error"}`` for each record whose status differs."""
    outputs: dict[str, OutputFigures] = field(default_factory=dict)
    skipped: Counter[str] = field(default_factory=Counter)
    """Why records were not replayed, with how many each."""
    logged_latency_ms: list[float] = field(default_factory=list)
    new_latency_ms: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.source = shown(self.source)

    @property
    def passed(self) -> bool:
        return self.sent > 0 and self.differing == 0 and not self.status_mismatches

    @property
    def sent(self) -> int:
        """Records sent again and answered (compared, on status only, or with another status)."""
        return self.compared + self.status_only + len(self.status_mismatches)

    def none_sent(self) -> str:
        """Why no record could be sent again (when ``sent`` is 0): the reasons with their counts, and what to change
        when records lost their inputs to the size cap."""
        reasons = ", ".join(f"{count} {reason}" for reason, count in self.skipped.items())
        text = (f"none of the {self.records} logged requests of model '{self.model}' in {self.source} could be sent "
                f"again ({reasons or 'no record'})")
        if any(reason.endswith("truncated") for reason in self.skipped):
            text += "; a record keeps its inputs when it fits SWITCHYARD_INFERENCE_LOG_MAX_RECORD_BYTES: raise it"
        return text

    @property
    def failures(self) -> int:
        """Records that differ: beyond the tolerances, or in their status."""
        return self.differing + len(self.status_mismatches)

    def skip(self, reason: str) -> None:
        self.records += 1
        self.skipped[reason] += 1

    def add(self, record: dict[str, Any], answer: Answer) -> None:
        """One logged record and what the replay got for the same request."""
        self.records += 1
        self.new_latency_ms.append(answer.latency_ms)
        if isinstance(record.get("latency_ms"), int | float):
            self.logged_latency_ms.append(float(record["latency_ms"]))
        logged_status = int(record.get("status") or 0)
        if logged_status != answer.status:
            self.status_mismatches.append(
                {"id": record.get("id"), "logged": logged_status, "new": answer.status, "error": answer.error}
            )
            return
        if record.get("response") is None or logged_status != 200:
            self.status_only += 1
            return
        self.compared += 1
        classified = {name for name, asked in output_parameters_of(record).items() if asked.get(CLASSIFICATION)}
        if self._outputs_differ(outputs_of(record), answer.outputs, classified):
            self.differing += 1

    def _outputs_differ(
        self, logged: dict[str, npt.NDArray[Any]], new: dict[str, npt.NDArray[Any]], classified: set[str]
    ) -> bool:
        """``classified``: the outputs the request asked a class count of."""
        differ = False
        for name, had in logged.items():
            figures = self.outputs.setdefault(name, OutputFigures())
            got = new.get(name)
            problem = _incomparable(had, got)
            if problem is not None or got is None:
                figures.problems[problem or "missing"] += 1
                figures.answers_off += 1
                differ = True
                continue
            figures.compared += 1
            compare = _compare_classes if name in classified else _compare_values
            if compare(figures, had, got, self.atol, self.rtol):
                figures.answers_off += 1
                differ = True
        return differ

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "version": self.version,
            "source": self.source,
            "passed": self.passed,
            "atol": self.atol,
            "rtol": self.rtol,
            "records": self.records,
            "compared": self.compared,
            "status_only": self.status_only,
            "differing": self.differing,
            "status_mismatches": len(self.status_mismatches),
            "mismatched_requests": self.status_mismatches[:SHOWN_MISMATCHES],
            "outputs": {name: figures.to_json() for name, figures in sorted(self.outputs.items())},
            "skipped": dict(self.skipped),
            "latency_ms": {
                "logged": _percentiles(self.logged_latency_ms),
                "new": _percentiles(self.new_latency_ms),
            },
        }

    def render(self) -> str:
        return render_report(self.to_json())


def resendable(record: dict[str, Any]) -> str | None:
    """``None`` when the record's request is to be sent again; else why not (for the report's ``skipped``).

    A shadow copy is not: its request is the one a client sent (logged apart, as its route says, when sampled), and
    its answer came from the shadow version and never reached the client: comparing a version with it would compare
    it with the shadow version, not with what the clients got."""
    if record.get("route") == "shadow":
        return SHADOW_COPY
    if record.get("redacted"):
        return f"{NOT_RESENDABLE}: inputs dropped by redaction"
    try:
        inputs_of(record)
    except RecordError as exc:
        tensors = record["request"].get("inputs", [])
        if any(isinstance(tensor, dict) and tensor.get("redacted") for tensor in tensors):
            return f"{NOT_RESENDABLE}: inputs redacted"
        if any(isinstance(tensor, dict) and tensor.get("truncated") for tensor in tensors):
            return f"{NOT_RESENDABLE}: inputs truncated"
        return f"inputs not readable: {exc}"
    try:
        parameters_of(record)
        output_parameters_of(record)
    except RecordError:
        return "request parameters not readable"
    return None


def _incomparable(had: npt.NDArray[Any], got: npt.NDArray[Any] | None) -> str | None:
    if got is None:
        return "missing from the new answer"
    if had.shape != got.shape:
        return "another shape"
    if (had.dtype == np.object_) != (got.dtype == np.object_):
        return "another datatype"
    return None


def _compare_values(
    figures: OutputFigures, had: npt.NDArray[Any], got: npt.NDArray[Any], atol: float, rtol: float
) -> bool:
    """Adds one answer's figures; whether it is beyond the tolerances."""
    if had.dtype == np.object_:
        off = int(sum(_as_bytes(a) != _as_bytes(b) for a, b in zip(had.reshape(-1), got.reshape(-1), strict=True)))
        figures.values_off += off
        return off > 0
    old, new = had.astype(np.float64), got.astype(np.float64)
    with np.errstate(invalid="ignore"):
        distance = np.abs(new - old)
    finite = distance[np.isfinite(distance)]
    if finite.size:
        figures.max_abs_diff = max(figures.max_abs_diff, float(finite.max()))
    off = int(np.count_nonzero(~np.isclose(new, old, atol=atol, rtol=rtol, equal_nan=True)))
    figures.values_off += off
    if (had.dtype.kind == "f" or had.dtype == BF16) and had.ndim >= 1 and had.shape[-1] > 1:
        figures.argmax_changed += int(np.count_nonzero(np.argmax(old, axis=-1) != np.argmax(new, axis=-1)))
    return off > 0


def _compare_classes(
    figures: OutputFigures, had: npt.NDArray[Any], got: npt.NDArray[Any], atol: float, rtol: float
) -> bool:
    """``_compare_values`` for a class count's answer: its scores are numbers printed as text, so comparing the text
    would fail two versions whose scores differ in the last digit, whatever the tolerances. Each logged class is
    looked up among the new answer's classes of its row by its index and label, and its score compared; a class no
    longer among them is a value off. Entries that are not ``score:class`` text are compared as bytes."""
    logged_rows, new_rows = _class_rows(had), _class_rows(got)
    if logged_rows is None or new_rows is None:
        return _compare_values(figures, had, got, atol, rtol)
    off = 0
    for logged_row, new_row in zip(logged_rows, new_rows, strict=True):
        scores = dict(new_row)
        for label, score in logged_row:
            new_score = scores.get(label)
            if new_score is None or not np.isclose(new_score, score, atol=atol, rtol=rtol, equal_nan=True):
                off += 1
            if new_score is not None and math.isfinite(new_score - score):
                figures.max_abs_diff = max(figures.max_abs_diff, abs(new_score - score))
        if logged_row and new_row and logged_row[0][0] != new_row[0][0]:
            figures.argmax_changed += 1
    figures.values_off += off
    return off > 0


def _class_rows(array: npt.NDArray[Any]) -> list[list[tuple[str, float]]] | None:
    """A class count's answer (``[k]`` or ``[rows, k]``) as rows of ``(index[:label], score)``, top first; ``None``
    when an entry is not ``score:index[:label]``."""
    width = array.shape[-1] if array.ndim else 1
    rows: list[list[tuple[str, float]]] = []
    for row in array.reshape(-1, width) if width else array.reshape(0, 0):
        entries = []
        for value in row.tolist():
            score, colon, label = _as_bytes(value).decode("utf-8", "replace").partition(":")
            if not colon:
                return None
            try:
                entries.append((label, float(score)))
            except ValueError:
                return None
        rows.append(entries)
    return rows


def _as_bytes(value: object) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _percentiles(values: list[float]) -> dict[str, float | None]:
    """Nearest-rank p50 and p99 (``None`` without values): the same figures a person computes from a sorted list."""
    if not values:
        return {"count": 0, "p50": None, "p99": None}
    ordered = sorted(values)

    def rank(fraction: float) -> float:
        return round(ordered[max(0, math.ceil(fraction * len(ordered)) - 1)], 3)

    return {"count": len(ordered), "p50": rank(0.50), "p99": rank(0.99)}


# -- plain text ---------------------------------------------------------------------------------------------
def render_report(report: dict[str, Any]) -> str:
    """A report's JSON (``ReplayReport.to_json``, also as a gateway answered it) as plain text within 80 columns."""
    verdict = "PASSED" if report.get("passed") else "FAILED"
    lines = [
        f"replay of model '{report.get('model')}' on version {report.get('version')}: {verdict}",
        f"  {report.get('records', 0)} records: {report.get('compared', 0)} compared, "
        f"{report.get('status_only', 0)} on status only, {sum(dict(report.get('skipped') or {}).values())} skipped",
        f"  {report.get('differing', 0)} beyond atol {report.get('atol')} / rtol {report.get('rtol')}, "
        f"{report.get('status_mismatches', 0)} with another status",
    ]
    outputs: dict[str, Any] = report.get("outputs") or {}
    if outputs:
        lines += ["", f"  {'output':<24} {'compared':>8} {'max |diff|':>11} {'values off':>10} {'argmax':>7}"]
        for name, figures in outputs.items():
            lines.append(
                f"  {_cut(name, 24):<24} {figures.get('compared', 0):>8} {_figure(figures.get('max_abs_diff')):>11} "
                f"{figures.get('values_off', 0):>10} {figures.get('argmax_changed', 0):>7}"
            )
            lines += [f"    {count} x {problem}" for problem, count in (figures.get("problems") or {}).items()]
    mismatches = report.get("mismatched_requests") or []
    if mismatches:
        lines += ["", "  status differs (first ones):"]
        lines += [_cut(f"    {m.get('id')}: logged {m.get('logged')}, now {m.get('new')}"
                       f"{': ' + str(m['error']) if m.get('error') else ''}", WIDTH) for m in mismatches]
    for reason, count in (report.get("skipped") or {}).items():
        lines.append(_cut(f"  skipped {count}: {reason}", WIDTH))
    latency = report.get("latency_ms") or {}
    logged, new = latency.get("logged") or {}, latency.get("new") or {}
    lines += [
        "",
        f"  latency ms   p50 {_figure(logged.get('p50')):>9} {_figure(new.get('p50')):>9}   "
        f"p99 {_figure(logged.get('p99')):>9} {_figure(new.get('p99')):>9}   (logged, new)",
    ]
    return "\n".join(lines)


def _figure(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
