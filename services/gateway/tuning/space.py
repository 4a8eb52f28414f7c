"""The search space, derived from what was measured before any trial: the single-request latency and the
batch-size/latency curve of the model on this backend, the SLO, and the devices there are to run instances on."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Any

from services.gateway.tuning.candidates import Candidate

KNEE_SHARE = 0.8
"""The knee of the curve: the smallest batch reaching this share of the best rows-per-second of any batch."""
MAX_DELAY_US = 20_000


@dataclass(frozen=True)
class Curve:
    latency_ms: dict[int, float]
    """Batch size -> median latency of one request of that many rows (one instance, no batcher, one client)."""

    @property
    def single_ms(self) -> float:
        return self.latency_ms[min(self.latency_ms)]

    def cap(self, p99_ms: float) -> int:
        """The largest measured batch whose own latency leaves room in the SLO for waiting on a batch that is
        running (a third of the SLO each); the smallest measured one when none does."""
        fitting = [size for size, ms in self.latency_ms.items() if ms <= p99_ms / 3]
        return max(fitting, default=min(self.latency_ms))

    def knee(self, cap: int) -> int:
        rates = {size: size / max(ms, 1e-6) for size, ms in self.latency_ms.items() if size <= cap}
        best = max(rates.values())
        return min(size for size, rate in rates.items() if rate >= KNEE_SHARE * best)

    def to_json(self) -> dict[str, Any]:
        return {"latency_ms": {str(size): round(ms, 4) for size, ms in sorted(self.latency_ms.items())}}


@dataclass(frozen=True)
class Space:
    instances: tuple[int, ...]
    delays_us: tuple[int, ...]
    preferred: tuple[tuple[int, ...], ...]
    max_batch_sizes: tuple[int, ...]

    def candidates(self) -> list[Candidate]:
        found = []
        for instances, delay, preferred, size in itertools.product(
            self.instances, self.delays_us, self.preferred, self.max_batch_sizes
        ):
            if all(p <= size for p in preferred):
                found.append(Candidate(instances, delay, preferred, size))
        return sorted(set(found))

    def to_json(self) -> dict[str, Any]:
        return {
            "instances": list(self.instances),
            "max_queue_delay_us": list(self.delays_us),
            "preferred_batch_sizes": [list(p) for p in self.preferred],
            "max_batch_size": list(self.max_batch_sizes),
        }


def derive(curve: Curve, p99_ms: float, *, max_instances: int) -> Space:
    """Instances 1..``max_instances``; queue delays from 0 to what the SLO leaves once two capped batches have
    run (at most ``MAX_DELAY_US``); preferred sizes at the curve's knee and cap; max batch sizes capped where one
    batch alone would take over a third of the SLO."""
    cap = curve.cap(p99_ms)
    knee = curve.knee(cap)
    room_ms = max(p99_ms - 2 * curve.latency_ms[cap], 0.0)
    bound = int(min(room_ms * 1e3 / 2, MAX_DELAY_US))
    delays = sorted({0, *(int(bound * share) for share in (0.05, 0.25, 1.0) if bound * share >= 10)})
    preferred: list[tuple[int, ...]] = [(), (knee,)]
    if knee < cap:
        preferred.append((knee, cap))
    sizes = sorted({cap, max(knee, cap // 2)})
    return Space(tuple(range(1, max_instances + 1)), tuple(delays), tuple(preferred), tuple(sizes))


def screen(space: Space, count: int, *, seed: int = 0) -> list[Candidate]:
    """``count`` candidates spread over the space: every instance count and every delay appear before any
    combination repeats one, the rest drawn at random (seeded: the same run screens the same candidates)."""
    pool = space.candidates()
    rng = random.Random(seed)
    rng.shuffle(pool)
    chosen: list[Candidate] = []
    seen_instances: set[int] = set()
    seen_delays: set[int] = set()
    for candidate in pool:  # first pass: cover each instance count and each delay
        if candidate.instances not in seen_instances or candidate.max_queue_delay_us not in seen_delays:
            chosen.append(candidate)
            seen_instances.add(candidate.instances)
            seen_delays.add(candidate.max_queue_delay_us)
    chosen = chosen[:count]
    chosen += [c for c in pool if c not in chosen][: max(count - len(chosen), 0)]
    return chosen
