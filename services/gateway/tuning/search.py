"""The bounded search: measure the curve, derive the space, screen candidates at the highest concurrency, then
measure them at every concurrency in rank order (the current settings right after the best two) until the budget
is spent: successive halving whose cut is where the budget ends."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from services.gateway.errors import GatewayError
from services.gateway.repository import ModelEntry
from services.gateway.tensors.types import InferInput
from services.gateway.tuning.candidates import Candidate, applied, current, unbatched
from services.gateway.tuning.curve import measure_curve
from services.gateway.tuning.drive import closed_loop
from services.gateway.tuning.hosts import TrialHost, to_the_end, trial_name
from services.gateway.tuning.options import TuneOptions
from services.gateway.tuning.requests import request_rows
from services.gateway.tuning.results import Measurement, Trial, qualifies, score
from services.gateway.tuning.space import Curve, Space, derive, screen

log = logging.getLogger(__name__)

WARMUP_S = 0.3
SCREEN_SHARE = 0.5
"""Of the budget left after the curve, what the screening round may take."""
FINALISTS = 2


@dataclass
class SearchState:
    """What a run has done so far; the admin API shows it while the run goes on."""

    phase: str = "starting"
    planned: int = 0
    trials: list[Trial] = field(default_factory=list)
    curve: Curve | None = None
    space: Space | None = None
    started: float = field(default_factory=time.monotonic)
    in_progress: str | None = None
    """The trial loaded and driven now (``trial 4 (i2 d500us p[8] b32)``), ``None`` between trials."""

    def to_json(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "planned_trials": self.planned,
            "elapsed_s": round(time.monotonic() - self.started, 2),
            "curve": self.curve.to_json() if self.curve is not None else None,
            "space": self.space.to_json() if self.space is not None else None,
            "in_progress": self.in_progress,
            "trials": [t.to_json() for t in self.trials],
        }


class Search:
    def __init__(
        self,
        host: TrialHost,
        entry: ModelEntry,
        version: int,
        options: TuneOptions,
        *,
        max_instances: int,
        state: SearchState,
    ) -> None:
        self._host = host
        self._entry = entry
        self._version = version
        self._options = options
        self._max_instances = max_instances
        self.state = state
        self._deadline = state.started + options.budget_s
        self._load_s = 1.0  # refined from every load this run makes
        self._requests: dict[int, list[InferInput]] = {}
        self._p99 = options.p99_ms

    async def run(self) -> list[Trial]:
        config = self._entry.config
        self._requests = await asyncio.to_thread(request_rows, self._entry, self._version, config)
        if self._options.candidates:
            return await self._measure(list(self._options.candidates), current(config))
        self.state.phase = "measuring the batch-latency curve"
        name = self._name(0)
        self.state.in_progress = "the batch-latency curve's trial (one instance, no batcher)"
        try:
            await self._load(name, unbatched(config, name=name))
            latencies = await measure_curve(self._host, name, self._version, self._requests)
        finally:
            try:
                await to_the_end(self._host.unload(name))
            finally:
                self.state.in_progress = None
        curve = self.state.curve = Curve(latencies)
        space = self.state.space = derive(curve, self._options.p99_ms, max_instances=self._max_instances)
        log.info("tuning '%s': curve %s, space %s", self._entry.name, curve.to_json(), space.to_json())
        defaults = current(config)
        top = self._options.concurrency[-1:]
        screen_cost = self._cost(len(top), self._options.duration_s / 2)
        full_cost = self._cost(len(self._options.concurrency), self._options.duration_s)
        count = max(2, int(self._left() * SCREEN_SHARE // screen_cost))
        pool = [c for c in screen(space, count - 1) if c != defaults]
        chosen = [defaults, *pool][:count]
        self.state.planned = len(chosen) + FINALISTS + 1
        self.state.phase = "screening at the highest concurrency"
        screened = []
        for candidate in chosen:
            if self._left() < screen_cost + 2 * full_cost:  # a small budget still measures two settings fully
                break
            screened.append(await self._trial(0, candidate, candidate == defaults, top, self._options.duration_s / 2))
        ranked = [t.candidate for t in sorted((t for t in screened if t.error is None), key=self._rank, reverse=True)]
        # The best two, then the current settings (measured as fully as the winner, to compare with), then the rest
        # in rank order while the budget lasts (less what the confirmations need): successive halving whose second
        # round ends where the budget does. Then the finalists run once more at the highest level.
        unscreened = [c for c in chosen if c not in ranked]
        order = list(dict.fromkeys([*ranked[:FINALISTS], defaults, *ranked[FINALISTS:], *unscreened]))
        top_cost = self._cost(1, self._options.duration_s)
        # Confirmations take only what is left beyond two full measurements: a small budget measures two settings.
        reserve = min((FINALISTS + 1) * top_cost, max(self._left() - 2 * full_cost, 0.0))
        await self._measure(order, defaults, reserve_s=reserve)
        self.state.phase = "confirming the finalists at the highest concurrency"
        finalists = self._finalists(defaults)
        fits = int(self._left() // top_cost)
        # The winner comes from the confirmed finalists (results.contenders), so a finalist left unconfirmed for want
        # of budget cannot win. They are confirmed in the order they are kept in, so that what the budget leaves out,
        # whether it is known now (``fits``) or only when the confirmations overrun their time, is the least needed
        # one: never the current settings (the baseline a winner must beat) nor the best one for a worse one. None
        # when it fits fewer than two to compare, leaving the first full runs to decide.
        finalists = finalists[:fits] if fits >= min(len(finalists), FINALISTS) else []
        for candidate in finalists:
            if self._left() < top_cost:
                break
            await self._trial(2, candidate, candidate == defaults, top, self._options.duration_s)
        self.state.phase = "done"
        return self.state.trials

    async def _measure(
        self, candidates: list[Candidate], defaults: Candidate, *, reserve_s: float = 0.0
    ) -> list[Trial]:
        """Each candidate at every concurrency, in order, while the budget (less ``reserve_s``) lasts."""
        full_cost = self._cost(len(self._options.concurrency), self._options.duration_s)
        fits = max(int((self._left() - reserve_s) // full_cost), 1)
        self.state.planned = len(self.state.trials) + min(len(candidates), fits)
        self.state.phase = "measuring at every concurrency"
        for candidate in candidates:
            if self._left() - reserve_s < full_cost:
                break
            await self._trial(1, candidate, candidate == defaults, self._options.concurrency, self._options.duration_s)
        self.state.phase = "done"
        return self.state.trials

    def _finalists(self, defaults: Candidate) -> list[Candidate]:
        """The best candidates meeting the SLO so far and the current ones (when they meet it), in the order they
        are kept when the budget cannot confirm them all: the current ones first (what a winner is compared with),
        then the others by throughput at the highest level (the best before a worse one)."""
        levels, trials = self._options.concurrency, self.state.trials
        meeting = {t.candidate for t in trials if t.round == 1 and qualifies(trials, t.candidate, self._p99, levels)}
        best = sorted(meeting, key=lambda c: score(trials, c, levels[-1]), reverse=True)[:FINALISTS]
        baseline = [defaults] if defaults in meeting else []
        return baseline + [c for c in best if c != defaults]

    async def _trial(
        self, round_: int, candidate: Candidate, default: bool, levels: tuple[int, ...], duration_s: float
    ) -> Trial:
        number = len(self.state.trials) + 1
        name = self._name(number)
        measurements: list[Measurement] = []
        error = None
        unload_error: GatewayError | None = None
        self.state.in_progress = f"trial {number} ({candidate.label})"
        try:
            await self._load(name, applied(self._entry.config, candidate, name=name))
            one = self._requests[min(self._requests)]

            async def send() -> None:
                await self._host.infer(name, self._version, one)

            for level in levels:
                measurements.append(
                    await closed_loop(
                        send, level, duration_s=duration_s, warmup_s=WARMUP_S, server_pids=self._host.server_pids
                    )
                )
        except GatewayError as exc:
            error = str(exc)
            log.warning("tuning '%s': trial %d (%s) failed: %s", self._entry.name, number, candidate.label, exc)
        finally:
            try:
                await to_the_end(self._host.unload(name))
            except GatewayError as exc:  # in place: the serving config is not back; the run ends, this trial kept
                unload_error = exc
            finally:
                self.state.in_progress = None
        trial = Trial(number, round_, candidate, default, tuple(measurements), error)
        self.state.trials.append(trial)
        figures = "; ".join(
            f"{m.concurrency} clients {m.throughput:.0f} req/s p50 {m.p50_ms:.2f} ms p99 {m.p99_ms:.2f} ms"
            for m in measurements
        )
        log.info("tuning '%s': trial %d round %d %s: %s", self._entry.name, number, round_, candidate.label, figures)
        if unload_error is not None:
            raise unload_error
        return trial

    async def _load(self, name: str, config: mc.ModelConfig) -> None:
        began = time.monotonic()
        await to_the_end(self._host.load(name, config, self._entry, self._version))
        self._load_s = max(self._load_s * 0.5 + (time.monotonic() - began) * 0.5, 0.05)

    def _rank(self, trial: Trial) -> tuple[bool, float]:
        top = trial.top
        meets = trial.meets(self._options.p99_ms, [top.concurrency] if top is not None else [])
        return meets, trial.throughput if meets else -trial.worst_p99_ms

    def _cost(self, levels: int, duration_s: float) -> float:
        """Seconds one trial takes: load, unload (about as long), and each level's warm-up and measurement."""
        return 2 * self._load_s + levels * (WARMUP_S + duration_s) + 0.1

    def _left(self) -> float:
        return self._deadline - time.monotonic()

    def _name(self, number: int) -> str:
        return self._entry.name if self._options.in_place else trial_name(self._entry.name, number)
