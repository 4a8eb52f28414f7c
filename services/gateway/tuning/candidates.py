"""One point of the search: the four settings the tuner changes, read from and written into a ``ModelConfig``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

_LABEL = re.compile(r"i(\d+) d(\d+)us p\[(-|\d+(?:,\d+)*)\] b(\d+)")


@dataclass(frozen=True, order=True)
class Candidate:
    instances: int
    max_queue_delay_us: int
    preferred_batch_sizes: tuple[int, ...]
    max_batch_size: int

    def __post_init__(self) -> None:
        wanted = [
            what
            for what, wrong in (
                ("at least 1 instance (i1)", self.instances < 1),
                ("a queue delay of 0 us or more", self.max_queue_delay_us < 0),
                ("a max batch size of at least 1 (b1)", self.max_batch_size < 1),
                (
                    f"preferred batch sizes from 1 to the max batch size, {self.max_batch_size}",
                    any(not 1 <= size <= self.max_batch_size for size in self.preferred_batch_sizes),
                ),
            )
            if wrong
        ]
        if wanted:
            raise ValueError(f"not a valid candidate: '{self.label}' needs {' and '.join(wanted)}")

    @property
    def label(self) -> str:
        preferred = ",".join(map(str, self.preferred_batch_sizes)) or "-"
        return f"i{self.instances} d{self.max_queue_delay_us}us p[{preferred}] b{self.max_batch_size}"

    @classmethod
    def parse(cls, label: str) -> Candidate:
        """The inverse of ``label`` (``i2 d500us p[8,16] b32``): what a table row names can be measured again."""
        found = _LABEL.fullmatch(" ".join(label.split()))
        if found is None:
            raise ValueError(f"not a candidate: {label!r}; write it as the trial table does, e.g. 'i2 d500us p[8] b32'")
        instances, delay, preferred, size = found.groups()
        sizes = () if preferred == "-" else tuple(int(p) for p in preferred.split(","))
        return cls(int(instances), int(delay), sizes, int(size))

    def to_json(self) -> dict[str, Any]:
        return {
            "instances": self.instances,
            "max_queue_delay_us": self.max_queue_delay_us,
            "preferred_batch_sizes": list(self.preferred_batch_sizes),
            "max_batch_size": self.max_batch_size,
        }

    @classmethod
    def from_json(cls, fields: dict[str, Any]) -> Candidate:
        return cls(
            int(fields["instances"]),
            int(fields["max_queue_delay_us"]),
            tuple(int(p) for p in fields["preferred_batch_sizes"]),
            int(fields["max_batch_size"]),
        )


def current(config: mc.ModelConfig) -> Candidate:
    """The settings ``config`` has now (the exporter's defaults for a freshly exported model)."""
    instances = sum(group.count or 1 for group in config.instance_group) if config.instance_group else 1
    batching = config.dynamic_batching
    return Candidate(
        instances=instances,
        max_queue_delay_us=int(batching.max_queue_delay_microseconds),
        preferred_batch_sizes=tuple(sorted(int(p) for p in batching.preferred_batch_size)),
        max_batch_size=int(config.max_batch_size),
    )


def untunable(config: mc.ModelConfig) -> str | None:
    """Why the tuner cannot tune ``config`` without changing what the model does (``None`` when it can): its four
    settings live in the dynamic batcher and one instance group, and it drives one-answer requests."""
    if config.max_batch_size <= 0:
        return "it does not batch (max_batch_size 0): there is nothing to tune"
    scheduling = config.WhichOneof("scheduling_choice")
    if scheduling not in (None, "dynamic_batching"):
        # scheduling_choice is a oneof: setting dynamic_batching would silently drop the model's own scheduler.
        return (
            f"its config uses {scheduling}, and the tuner tunes dynamic_batching, which would replace it; tune "
            f"a model with dynamic_batching (or no scheduler)"
        )
    if config.model_transaction_policy.decoupled:
        return (
            "it is decoupled (model_transaction_policy { decoupled: true }): the tuner measures requests answered "
            "once"
        )
    if len(config.instance_group) > 1:
        return (
            f"its config has {len(config.instance_group)} instance_group entries and the tuner sets one instance "
            f"count; give it one instance_group to tune"
        )
    return None


def applied(config: mc.ModelConfig, candidate: Candidate, *, name: str | None = None) -> mc.ModelConfig:
    """A copy of ``config`` with the candidate's settings (and another model name when given); the instance group's
    other fields (kind, GPUs, name, rate limiter...) and everything else stay as they were. ``config`` must be
    tunable (``untunable`` is ``None``)."""
    problem = untunable(config)
    if problem is not None:
        raise ValueError(f"model '{config.name}' cannot be tuned: {problem}")
    tuned = mc.ModelConfig()
    tuned.CopyFrom(config)
    if name is not None:
        tuned.name = name
    tuned.max_batch_size = candidate.max_batch_size
    group = tuned.instance_group[0] if tuned.instance_group else tuned.instance_group.add()
    group.count = candidate.instances
    batching = tuned.dynamic_batching  # touching it sets the field: dynamic batching on
    batching.max_queue_delay_microseconds = candidate.max_queue_delay_us
    del batching.preferred_batch_size[:]
    batching.preferred_batch_size.extend(candidate.preferred_batch_sizes)
    return tuned


def unbatched(config: mc.ModelConfig, *, name: str) -> mc.ModelConfig:
    """One instance, no dynamic batcher: each request runs as sent (what the batch-latency curve measures)."""
    probe = mc.ModelConfig()
    probe.CopyFrom(config)
    probe.name = name
    del probe.instance_group[1:]
    group = probe.instance_group[0] if probe.instance_group else probe.instance_group.add()
    group.count = 1
    probe.ClearField("dynamic_batching")
    return probe
