"""Where the embedded backend runs a batch: on the event loop's own thread when it is expected to be quick, else on
the version's worker threads.

Handing a batch to a worker thread and back costs tens of microseconds of CPU and a GIL hand-over each way: for a
tiny model more than its whole run, and under load the biggest single cost per request. A long run must not hold
up the loop (every other request waits for it), so only batches expected to take less than ``inline_below_s`` run
inline. The expectation is a line, a fixed cost per run plus a cost per row (a tiny model's run is mostly the
fixed part), fitted to the CPU time of recent runs on the thread that made them: their wall time includes waiting
for the GIL, which would make the threads look dearer the more they are used.

The same line tells the batcher whether waiting for a bigger batch pays (``worth_waiting``): a model whose cost is
all per row (a CNN on one CPU thread, whose rows per second are the same at batch 1 and 32) gains nothing from
company, and while its batch waits for it the instance idles. For such a model an instance's next batch also forms
while its current one runs (``forms_ahead``), and goes to the threads at once: a batch formed early loses nothing by
being smaller, and the thread that finishes a batch starts the next without waiting for the event loop to hand it
over.

The line only knows the shapes it has seen. A batch runs inline only when each of its rows is no bigger (in input
elements, or characters for text) than the rows of a run already measured, so a first long sequence or large image
goes to the threads; a model whose run time follows its input values (``steady=False``: a loop, a branch) never runs
inline; and a run that still takes ``OVERRUN`` times the inline budget turns inlining off for the version, logged."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor

from services.gateway.tensors.types import Array

Run = Callable[[dict[str, Array]], dict[str, Array]]

log = logging.getLogger(__name__)

OVERRUN = 50
"""An inline run that takes this many times ``inline_below_s`` of CPU stalled the loop for every other request: the
version's batches go to its threads from then on."""


class RunCost:
    """``seconds(rows)``: a least-squares line through recent (rows, seconds) runs, weighted towards the latest."""

    WEIGHT = 0.05
    FITTED_AFTER = 8
    """Runs seen before ``saving`` answers: the first ones are warm-up and a cold start."""

    def __init__(self) -> None:
        self.runs = 0
        self._x = self._y = self._xx = self._xy = 0.0

    def add(self, rows: int, seconds: float) -> None:
        w = self.WEIGHT if self.runs else 1.0
        self.runs += 1
        self._x += w * (rows - self._x)
        self._y += w * (seconds - self._y)
        self._xx += w * (rows * rows - self._xx)
        self._xy += w * (rows * seconds - self._xy)

    def seconds(self, rows: int) -> float:
        spread = self._xx - self._x * self._x
        if spread < 0.25:  # (nearly) one batch size seen: scale by rows, which can only overestimate a bigger batch
            return self._y * max(rows / max(self._x, 1.0), 1.0)
        slope = max((self._xy - self._x * self._y) / spread, 0.0)
        fixed = max(self._y - slope * self._x, 0.0)
        return fixed + slope * rows

    def saving(self, rows: int, bigger: int) -> float | None:
        """The share of the cost per row that a batch of ``bigger`` rows saves over one of ``rows``; ``None`` until
        the runs seen fit a line (several batch sizes, not only the first runs)."""
        if self.runs < self.FITTED_AFTER or self._xx - self._x * self._x < 0.25:
            return None
        per_row = self.seconds(rows) / rows
        if per_row <= 0:
            return None
        return 1.0 - self.seconds(bigger) / bigger / per_row


WAIT_SAVING = 0.05
"""A batch waits for company (its queue delay) only when a full batch is expected to cost at least this share less per
row: below it the wait buys latency and an idle instance, not throughput."""


AHEAD_UNTIL_SAVING = 2 * WAIT_SAVING
"""Once an instance's next batch forms ahead, it does until a full batch is expected to save this share per row."""


class Placement:
    def __init__(
        self, run: Run, pool: Executor, *, batching: bool, inline_below_s: float, steady: bool = True, label: str = ""
    ) -> None:
        """``steady``: whether the model's run time follows its input shapes alone; ``label`` names it in logs."""
        self._run = run
        self._pool = pool
        self._batching = batching
        self._below = inline_below_s if steady else 0.0
        self._label = label
        self._widest = 0.0
        """The most input elements (characters for text) per row of any run measured."""
        self.cost = RunCost()
        self.inline_runs = 0
        self.thread_runs = 0
        self._ahead = False

    def on_thread(self, rows: int) -> bool:
        """Whether a batch of ``rows`` goes to a worker thread (beside other batches) rather than inline."""
        return not (self.cost.runs and self.cost.seconds(rows) < self._below)

    def worth_waiting(self, rows: int, full: int) -> bool:
        """Whether a batch of ``rows`` should wait for more, on the way to ``full``: yes while the runs seen cannot
        tell (the configured delay is then spent, as Triton spends it)."""
        saving = self.cost.saving(max(rows, 1), max(full, rows, 1))
        return saving is None or saving >= WAIT_SAVING

    def forms_ahead(self, rows: int, full: int) -> bool:
        """Whether an instance's next batch should form while its current one runs, for batches of about ``rows``
        (recent ones): when they go to the worker threads and company is known not to make them cheaper per row
        (the batch formed ahead is whatever is queued, as a batch that does not wait for company is). Once it
        does, it goes on until company would save twice ``WAIT_SAVING``: the batches it forms are smaller, and
        that alone must not switch it off and on again."""
        saving = self.cost.saving(max(rows, 1), max(full, rows, 1))
        if saving is None or not self.on_thread(rows):
            self._ahead = False
        else:
            self._ahead = saving < (AHEAD_UNTIL_SAVING if self._ahead else WAIT_SAVING)
        return self._ahead

    async def execute(self, inputs: dict[str, Array]) -> tuple[dict[str, Array], float]:
        """The outputs, and how long the batch waited for a worker thread (a batch formed ahead waits for the run
        before it)."""
        rows = self._rows(inputs)
        width = _elements(inputs) / rows
        if width <= self._widest and not self.on_thread(rows):
            began = time.thread_time()
            outputs = self._run(inputs)
            spent = time.thread_time() - began
            self.cost.add(rows, spent)
            self.inline_runs += 1
            if spent > OVERRUN * self._below:
                self._overran(rows, spent)
            return outputs, 0.0
        self.thread_runs += 1
        handed = time.monotonic()
        outputs, started = await asyncio.get_running_loop().run_in_executor(self._pool, self._timed, inputs, rows)
        self._widest = max(self._widest, width)
        return outputs, max(started - handed, 0.0)

    def _overran(self, rows: int, spent: float) -> None:
        log.warning(
            "model %s: a batch of %d row(s) expected to take under %.0f us took %.1f ms on the event loop's thread; "
            "its batches run on its worker threads from now on",
            self._label or "(unnamed)", rows, self._below * 1e6, spent * 1e3,
        )
        self._below = 0.0

    def _timed(self, inputs: dict[str, Array], rows: int) -> tuple[dict[str, Array], float]:
        """In the worker thread: the run, when it started, and its CPU time (not the wait for the GIL) as an
        estimate of its cost."""
        started = time.monotonic()
        began = time.thread_time()
        outputs = self._run(inputs)
        # From a worker thread: a race with another blends two updates of plain floats, nothing worse.
        self.cost.add(rows, time.thread_time() - began)
        return outputs, started

    def _rows(self, inputs: dict[str, Array]) -> int:
        if not self._batching or not inputs:
            return 1
        first = next(iter(inputs.values()))
        return max(int(first.shape[0]), 1) if first.ndim else 1


def _elements(inputs: dict[str, Array]) -> int:
    """A batch's size for comparing rows: its input elements, counting a text element by its characters."""
    total = 0
    for value in inputs.values():
        total += sum(len(item) for item in value.flat) if value.dtype == object else int(value.size)
    return total
