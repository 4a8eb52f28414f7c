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
        if self.instances < 1 or self.max_queue_delay_us < 0 or self.max_batch_size < 1:
            raise ValueError(f"not a valid candidate: {self}")
        if any(not 1 <= size <= self.max_batch_size for size in self.preferred_batch_sizes):
            raise ValueError(f"preferred batch sizes {self.preferred_batch_sizes} exceed {self.max_batch_size}")

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


def applied(config: mc.ModelConfig, candidate: Candidate, *, name: str | None = None) -> mc.ModelConfig:
    """A copy of ``config`` with the candidate's settings (and another model name when given); the instance
    kind (CPU/GPU) and everything else stay as they were."""
    tuned = mc.ModelConfig()
    tuned.CopyFrom(config)
    if name is not None:
        tuned.name = name
    tuned.max_batch_size = candidate.max_batch_size
    kind = config.instance_group[0].kind if config.instance_group else mc.ModelInstanceGroup.KIND_AUTO
    gpus = list(config.instance_group[0].gpus) if config.instance_group else []
    del tuned.instance_group[:]
    group = tuned.instance_group.add(count=candidate.instances, kind=kind)
    group.gpus.extend(gpus)
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
    kind = config.instance_group[0].kind if config.instance_group else mc.ModelInstanceGroup.KIND_AUTO
    del probe.instance_group[:]
    probe.instance_group.add(count=1, kind=kind)
    probe.ClearField("dynamic_batching")
    return probe
