"""The tuner inside the gateway: one run at a time in the background (``POST /admin/models/{m}/tune``), its
progress and result per model (``GET``), and its cancellation (``DELETE``, or the gateway stopping), which ends the
trial in progress and unloads every trial before it answers.

Each run has an id (``POST`` answers it): ``GET`` and ``DELETE`` with ``?run=<id>`` mean that run and no other, so a
client that lost track (its run ended, someone else started one) never reads or cancels another person's run."""

from __future__ import annotations

import asyncio
import contextlib
import glob
import logging
import math
import os
import re
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from services.gateway.backends.triton import TritonBackend
from services.gateway.backends.triton.trials import NotRestored, TritonTrials
from services.gateway.errors import Conflict, GatewayError, InvalidInput, ModelNotFound
from services.gateway.state import Event
from services.gateway.state.records import now_iso
from services.gateway.tuning.candidates import Candidate, current, untunable
from services.gateway.tuning.hosts import EmbeddedTrials, TrialHost, to_the_end
from services.gateway.tuning.options import TuneOptions
from services.gateway.tuning.publish import PublishError, publish
from services.gateway.tuning.results import (
    Trial,
    best_p99_ms,
    closest,
    contenders,
    finite_ms,
    pareto_front,
    score,
    winner,
    worst_p99_ms,
)
from services.gateway.tuning.search import Search, SearchState
from services.gateway.versions.manager import VersionManager

log = logging.getLogger(__name__)

KEPT_RUNS = 32
"""Ended runs ``GET ?run=<id>`` still answers after newer ones started (the newest per model is kept anyway)."""
_RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def new_run_id() -> str:
    return secrets.token_hex(6)


@dataclass
class TuneRun:
    model: str
    version: int
    options: TuneOptions
    actor: str
    id: str = field(default_factory=new_run_id)
    """Names this run and no other: ``GET`` and ``DELETE`` take it as ``?run=<id>``."""
    state: SearchState = field(default_factory=SearchState)
    status: str = "running"
    """``running``, ``succeeded`` (a winner), ``failed`` (none, or an error) or ``cancelled``."""
    error: str | None = None
    winner: Trial | None = None
    published: dict[str, str] | None = None
    finished_s: float | None = None
    cancelled: dict[str, str | None] | None = None
    """Who cancelled the run (``DELETE``), when, in which phase, and the trial that was ended then."""
    publishing: bool = False
    """The winner is being written: a cancel now would leave config.pbtxt's write unfinished, so it is refused."""
    serving_config: dict[str, Any] | None = None
    """An in-place run (Triton): whether the serving config was loaded back after its trials (``restored``), and
    when not, Triton's reason (``error``), the attempts and what the model serves now (``serving_now``)."""

    def to_json(self) -> dict[str, Any]:
        trials = self.state.trials
        defaults = [t for t in trials if t.default and t.round == 1]
        return {
            "id": self.id,
            "model": self.model,
            "version": self.version,
            "status": self.status,
            "options": self.options.to_json(),
            "actor": self.actor,
            "error": self.error,
            "winner": self.winner.to_json() if self.winner is not None else None,
            "winner_throughput": self._score(self.winner),
            "winner_worst_p99_ms": self._worst_p99_ms(self.winner),
            "defaults": defaults[0].to_json() if defaults else None,
            "defaults_throughput": self._score(defaults[0] if defaults else None),
            "defaults_worst_p99_ms": self._worst_p99_ms(defaults[0] if defaults else None),
            "pareto_front": [t.number for t in pareto_front(trials)],
            "best_p99_ms": best_p99_ms(trials),
            "published": self.published,
            "cancelled": self.cancelled,
            "serving_config": self.serving_config,
            "duration_s": self.finished_s,
            **self.state.to_json(),
        }


    def _score(self, trial: Trial | None) -> float | None:
        """Throughput at the highest level, averaged over every run of the trial's settings."""
        if trial is None:
            return None
        return round(score(self.state.trials, trial.candidate, self.options.concurrency[-1]), 1)

    def _worst_p99_ms(self, trial: Trial | None) -> float | None:
        """The highest p99 over every level of every run of the trial's settings: what the SLO was judged by (the
        trial itself is only their first run)."""
        if trial is None:
            return None
        return finite_ms(worst_p99_ms(self.state.trials, trial.candidate), 3)


class TuneService:
    def __init__(self, manager: VersionManager) -> None:
        self._manager = manager
        self._task: asyncio.Task[None] | None = None
        self._runs: dict[str, TuneRun] = {}
        """model -> its current run: the newest one, running or ended."""
        self._kept: OrderedDict[str, TuneRun] = OrderedDict()
        """id -> run, the newest ``KEPT_RUNS`` (a model's current run also stays in ``_runs``)."""

    def start(self, model: str, options: TuneOptions, actor: str) -> TuneRun:
        """Start a run in the background; 409 while another one runs (trials share the CPU: one at a time)."""
        entry = self._manager.catalog.entry(model)
        if self._task is not None and not self._task.done():
            busy = next((run for run in self._runs.values() if run.status == "running"), None)
            what = f"model '{busy.model}' is being tuned" if busy else "a tuning run is finishing"
            raise Conflict(f"{what}; one tuning run at a time: try again when it has finished")
        if options.in_place and not isinstance(self._manager.backend, TritonBackend):
            raise InvalidInput("in_place needs the Triton backend; embedded trials always run beside the model")
        version = options.version
        if version is None:
            record = self._manager.router.record(model)
            version = record.stable if record is not None else max(entry.available, default=None)
        if version is None or version not in entry.available:
            raise ModelNotFound(f"model '{model}' has no version {version} in the repository to tune")
        problem = untunable(entry.config)
        if problem is not None:
            raise InvalidInput(f"model '{model}' cannot be tuned: {problem}")
        run = TuneRun(model, version, options, actor)
        self._runs[model] = run
        self._kept[run.id] = run
        while len(self._kept) > KEPT_RUNS:
            self._kept.popitem(last=False)
        self._task = asyncio.create_task(self._run(run), name=f"tune-{model}")
        log.info("tuning '%s' version %d: run %s started by %s", model, version, run.id, actor)
        return run

    def status(self, model: str, run_id: str | None = None) -> TuneRun:
        """The model's current run, or (``run_id``) that run, even when a newer one has started since."""
        self._manager.catalog.entry(model)
        run = self._runs.get(model)
        if run_id is not None:
            checked_run_id(run_id)
            named = run if run is not None and run.id == run_id else self._kept.get(run_id)
            if named is None or named.model != model:
                raise ModelNotFound(
                    f"model '{model}' has no tuning run {run_id}"
                    + (f" (its current run is {run.id})" if run is not None else "")
                    + f": the gateway keeps the last {KEPT_RUNS} runs since it started"
                )
            return named
        if run is None:
            raise ModelNotFound(f"model '{model}' has not been tuned since the gateway started")
        return run

    async def cancel(self, model: str, actor: str, run_id: str | None = None) -> TuneRun:
        """Stop the model's running run and answer once it has stopped: the trial in progress ended, every trial
        unloaded (an in-place one: the serving config loaded back), nothing written. ``run_id``: only when that is
        the model's current run. 404 when the model has no run, 409 when the run named is not the current one, or
        the run has ended or is writing its winner."""
        self._manager.catalog.entry(model)
        run = self._runs.get(model)
        if run is None:
            named = f" {checked_run_id(run_id)}" if run_id is not None else ""
            raise ModelNotFound(
                f"model '{model}' has no tuning run{named} to cancel: it has not been tuned since the gateway started"
            )
        if run_id is not None and checked_run_id(run_id) != run.id:
            earlier = self._kept.get(run_id)
            ended = f" (it has ended: {earlier.status})" if earlier is not None and earlier.model == model else ""
            raise Conflict(
                f"tuning run {run_id}{ended} is not the current run of model '{model}': that is run {run.id} "
                f"({run.status}, started by {run.actor}); neither was cancelled"
            )
        task = self._task
        if run.status != "running" or task is None or task.done():
            raise Conflict(
                f"the tuning run of model '{model}' has already ended ({run.status}"
                f"{', cancelled by ' + str(run.cancelled['by']) if run.cancelled else ''}): there is nothing to cancel"
            )
        if run.publishing:
            raise Conflict(
                f"the tuning run of model '{model}' is writing its winner to config.pbtxt and is not cancelled "
                f"mid-write; it ends in moments: GET /admin/models/{model}/tune says how it ended"
            )
        run.cancelled = {"by": actor, "at": now_iso(), "phase": run.state.phase, "stopped": run.state.in_progress}
        task.cancel()
        await asyncio.wait({task})  # not `await task`: its CancelledError is not this request's
        if run.status == "running":  # cancelled before its first step: nothing of it ran
            self._cancelled(run)
            run.finished_s = round(time.monotonic() - run.state.started, 2)
        restored = run.serving_config is None or run.serving_config["restored"]
        await self._manager.record(
            Event("tune", model, "unchanged" if restored else "failed", {"version": run.version}, error=run.error,
                  actor=actor, detail={"run": run.id, "cancelled": run.cancelled, "trials": len(run.state.trials),
                                       "serving_config": run.serving_config})
        )
        return run

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @staticmethod
    def _cancelled(run: TuneRun, *, unloaded: bool = True) -> None:
        """``unloaded``: the trial it stopped is gone (an in-place one: the serving config is back)."""
        run.status = "cancelled"
        if run.cancelled is None:
            run.error = "the gateway stopped during the run"
            return
        stopped = run.cancelled["stopped"]
        run.error = (
            f"cancelled by {run.cancelled['by']} at {run.cancelled['at']} while {run.cancelled['phase']}"
            + (f": {stopped} was ended" + (" and unloaded" if unloaded else "") if stopped else "")
            + "; nothing was written"
        )

    async def _run(self, run: TuneRun) -> None:
        host = self._host()
        try:
            # The config on disk is what the trials vary and what --write replaces (a run may have written it since
            # the version loaded): read it again.
            entry = await asyncio.to_thread(self._manager.catalog.refresh, run.model, run.version)
            limit = max_instances(entry.config)
            search = Search(host, entry, run.version, run.options, max_instances=limit, state=run.state)
            problem = untunable(entry.config)  # checked at start, but the file may have changed since
            if problem is not None:
                raise InvalidInput(f"model '{run.model}' cannot be tuned: {problem}")
            trials = await search.run()
            run.winner = winner(trials, run.options.p99_ms, run.options.concurrency)
            if run.winner is None:
                run.status, run.error = "failed", _no_winner(trials, run.options)
            elif run.options.write:
                run.publishing = True
                try:
                    run.published = await self._publish(run, run.winner)
                finally:
                    run.publishing = False
                run.status = "succeeded"
            else:
                run.status = "succeeded"
        except asyncio.CancelledError:
            self._cancelled(run)
            raise
        except (GatewayError, PublishError, OSError) as exc:
            run.status, run.error = "failed", str(exc)
            log.warning("tuning '%s' failed: %s", run.model, exc)
        except Exception as exc:  # a run must end with a status, whatever happened
            run.status, run.error = "failed", f"tuning failed unexpectedly: {exc}"
            log.exception("tuning '%s' failed", run.model)
        finally:
            run.finished_s = round(time.monotonic() - run.state.started, 2)
            try:
                await to_the_end(host.close())
            finally:
                if isinstance(host, TritonTrials) and run.options.in_place:
                    await self._restore_outcome(run, host.not_restored)

    async def _restore_outcome(self, run: TuneRun, failure: NotRestored | None) -> None:
        """An in-place run says whether the serving config is back. When it is not, the run does not end as a
        success (nor as a plain cancel), the versions Triton serves with a trial's config say so in the admin API
        until the model's own config is sent again, and the audit log has it (a cancel's event is written by
        ``cancel``)."""
        if failure is None:
            run.serving_config = {"restored": True}
            self._manager.notes.config_sent(run.model)  # an earlier run's note, if any: its own config is back
            return
        serving_now, changed = _serving_now(failure)
        # Any load or unload through the gateway sends the model's whole config to Triton again (backends/triton).
        fix = (
            f"; a load or unload of a version of '{run.model}' (switchyard models load|unload) loads its own config "
            "back into Triton" if changed else ""
        )
        run.serving_config = {"restored": False, "error": failure.reason, "attempts": failure.attempts,
                              "serving_now": serving_now}
        problem = (
            f"the serving config of model '{run.model}' could not be loaded back into Triton after an in-place trial "
            f"({failure.attempts} attempts): {failure.reason}; {serving_now}{fix}"
        )
        if run.status == "cancelled":
            self._cancelled(run, unloaded=False)
            run.error = f"{run.error}; but {problem}"
        else:
            run.status, run.error = "failed", problem
        if changed:
            note = f"{serving_now}: tuning run {run.id} could not load its own config back ({failure.reason}){fix}"
            versions = failure.ready or tuple(self._manager.backend.models().get(run.model, {}))
            self._manager.notes.foreign_config(run.model, frozenset(versions), note)
        if run.cancelled is None:  # a run that ended by itself, or by the gateway stopping: no DELETE records it
            await self._manager.record(
                Event("tune", run.model, "failed", {"version": run.version}, error=run.error, actor=run.actor,
                      detail={"run": run.id, "trials": len(run.state.trials), "serving_config": run.serving_config})
            )

    async def _publish(self, run: TuneRun, best: Trial) -> dict[str, str]:
        entry = self._manager.catalog.entry(run.model)
        table = {k: v for k, v in run.to_json().items() if k != "published"}
        done = await asyncio.to_thread(publish, self._manager.catalog.root, entry.path, best.candidate, table)
        await self._manager.record(
            Event("tune", run.model, "ok", {"version": run.version}, actor=run.actor,
                  detail={"run": run.id, **done.to_json()})
        )
        return done.to_json()

    def _host(self) -> TrialHost:
        backend = self._manager.backend
        if isinstance(backend, TritonBackend):
            return backend.trials()
        return EmbeddedTrials(self._manager.settings)


def checked_run_id(value: str) -> str:
    """A run id from a query (``?run=``): what ``new_run_id`` makes, or anything of its alphabet up to 64 long."""
    if _RUN_ID.fullmatch(value) is None:
        shown = value if len(value) <= 64 else value[:64] + "..."
        raise InvalidInput(f"run must be a tuning run's id as POST answered it (e.g. 3f9c0a1b2d4e), got {shown!r}")
    return value


def _serving_now(failure: NotRestored) -> tuple[str, bool]:
    """What Triton serves the model with, as far as it said, and whether that may be other than its own config."""
    model = failure.model
    if failure.ready is not None and not failure.ready:
        return f"Triton serves no version of '{model}' now (the gateway loads its own config again once its health "\
            "probe sees that)", False
    if failure.config is None:
        return f"what Triton serves '{model}' with now could not be read ({failure.unread})", True
    versions = f"Triton serves version(s) {', '.join(map(str, failure.ready or ()))} of '{model}'"
    try:
        reported, trial, own = current(failure.config), current(failure.trial), current(failure.serving)
    except ValueError as exc:
        return f"{versions} with settings the tuner cannot read ({exc})", True
    if _same_settings(reported, own):
        return f"{versions} with its own settings ({own.label})", False
    if _same_settings(reported, trial):
        return f"{versions} with the trial's settings ({trial.label}), not its own ({own.label})", True
    return f"{versions} with settings {reported.label}, neither its own ({own.label}) nor the trial's", True


def _same_settings(reported: Candidate, sent: Candidate) -> bool:
    """Whether Triton serves the settings sent: it completes a config that names no preferred batch size with the
    max batch size as the one preferred."""
    if reported == sent:
        return True
    return not sent.preferred_batch_sizes and reported == replace(sent, preferred_batch_sizes=(sent.max_batch_size,))


def max_instances(config: mc.ModelConfig) -> int:
    """The CPU count, or twice the GPU count for a model whose instances run on GPUs."""
    gpu = any(group.kind == mc.ModelInstanceGroup.KIND_GPU for group in config.instance_group)
    gpus = len(glob.glob("/dev/nvidia[0-9]*"))
    return 2 * gpus if gpu and gpus else len(os.sched_getaffinity(0)) or 1


def _no_winner(trials: list[Trial], options: TuneOptions) -> str:
    seen = closest(trials)
    levels = ", ".join(map(str, options.concurrency))
    if seen is None:
        return f"no trial was measured within the {options.budget_s:g} s budget; give it a larger --budget-s"
    if not any(t.round == 1 and t.error is None for t in trials):
        return (
            f"the {options.budget_s:g} s budget measured no setting at every concurrency ({levels}); give it a larger "
            f"--budget-s (while screening, {_closest(seen)})"
        )
    confirmed = contenders(trials) if any(t.round == 2 for t in trials) else []
    if confirmed:  # every finalist broke the SLO when measured again: the others had one run only
        worst = min(worst_p99_ms(trials, c) for c in confirmed)
        labels = ", ".join(c.label for c in confirmed)
        return (
            f"no finalist met p99 <= {options.p99_ms:g} ms in every run: measured again, the finalists ({labels}) "
            f"broke it (worst p99 {worst:.2f} ms at best); the figures vary more than the SLO allows: give it a "
            f"longer --duration or a quieter machine"
        )
    return f"no setting met p99 <= {options.p99_ms:g} ms at every concurrency ({levels}); {_closest(seen)}"


def _closest(trial: Trial) -> str:
    """How the closest setting fared: its worst p99, and when requests failed (a failed request breaks the SLO too,
    and one that answered none has no p99), how many failed and why."""
    where = f"{trial.candidate.label}, trial {trial.number}"
    failed = next((m for m in trial.measurements if m.errors), None)
    silent = next((m for m in trial.measurements if not m.requests), None)
    if failed is None and silent is not None:  # its first answers came after the measured time had ended
        return (
            f"the closest setting ({where}) answered no request within the measured time at {silent.concurrency} "
            f"clients: give it a longer --duration"
        )
    if failed is None:
        return f"the best p99 seen was {trial.worst_p99_ms:.2f} ms ({where})"
    p99 = f"worst p99 {trial.worst_p99_ms:.2f} ms, " if math.isfinite(trial.worst_p99_ms) else ""
    return (
        f"the closest setting ({where}) had {p99}{failed.errors} of {failed.errors + failed.requests} requests "
        f"failed at {failed.concurrency} clients: {failed.error}"
    )
