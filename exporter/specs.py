"""Frozen, self-validating descriptions of what an export should produce."""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass, field
from typing import Literal

from exporter.dtypes import TRITON_DATATYPES
from exporter.errors import InvalidSpecError

Format = Literal["onnx", "torchscript"]
Kind = Literal["cpu", "gpu"]

_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def validate_model_name(name: str) -> str:
    """Model names become directory names in the repository and path segments in URLs."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name.startswith("."):
        raise InvalidSpecError(
            f"invalid model name {name!r}: use letters, digits, '_', '-' and '.', "
            "not starting with '.' and without path separators (e.g. 'resnet50' or 'fraud-v2')"
        )
    return name


def validate_tensor_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidSpecError(
            f"invalid tensor name {name!r}: use letters, digits, '_', '-' and '.' (e.g. 'input_ids')"
        )
    return name


@dataclass(frozen=True)
class TensorSpec:
    """A served tensor: Triton datatype and dims **without** the batch dim (``-1`` = dynamic)."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None = None
    """The model's own dims where they differ from the served ones (config.pbtxt's ``reshape``): a tensor of shape
    (batch,) is served as ``dims: [1]`` with ``reshape { shape: [] }``, since Triton refuses a batched tensor
    without dims."""

    def __post_init__(self) -> None:
        validate_tensor_name(self.name)
        if self.datatype not in TRITON_DATATYPES:
            raise InvalidSpecError(
                f"tensor {self.name!r}: unknown datatype {self.datatype!r}; "
                f"expected one of {', '.join(sorted(TRITON_DATATYPES))}"
            )
        if any(d == 0 or d < -1 for d in self.dims):
            raise InvalidSpecError(
                f"tensor {self.name!r}: dims {list(self.dims)} must be positive sizes or -1 for dynamic"
            )

    @classmethod
    def parse(cls, text: str) -> TensorSpec:
        """``NAME:DTYPE:SHAPE`` as given on the command line, e.g. ``image:FP32:3,64,64``."""
        parts = text.split(":")
        if len(parts) != 3:
            raise InvalidSpecError(
                f"invalid --input {text!r}: expected NAME:DTYPE:SHAPE, e.g. image:FP32:3,64,64 "
                "(shape without the batch dim, -1 for a dynamic dim)"
            )
        name, dtype, shape = parts
        try:
            dims = tuple(int(d) for d in shape.split(",") if d.strip())
        except ValueError:
            raise InvalidSpecError(
                f"invalid shape {shape!r} in --input {text!r}: expected comma-separated integers like 3,64,64"
            ) from None
        return cls(name=name, datatype=dtype.upper().removeprefix("TYPE_"), dims=dims)


INT32_MAX = 2**31 - 1
UINT32_MAX = 2**32 - 1
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1
"""The widths of the config.pbtxt fields options land in (Triton's model_config.proto): a value past its field's
range cannot be written, and is refused as the option's error rather than protobuf's ``Value out of range``."""


def check_range(label: str, value: int, low: int, high: int, field_type: str) -> None:
    if not low <= value <= high:
        raise InvalidSpecError(
            f"{label} must lie between {low} and {high} (got {value}): Triton holds it as {field_type}, so no "
            "config.pbtxt can carry a value past that"
        )


@dataclass(frozen=True)
class VersionPolicy:
    """Which versions Triton (and the embedded runtime) load: ``latest:N``, ``all`` or ``specific:1,2``."""

    kind: Literal["latest", "all", "specific"] = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind == "latest" and self.num_versions < 1:
            raise InvalidSpecError(f"version policy latest:{self.num_versions}: N must be at least 1")
        if self.kind == "specific" and (not self.versions or min(self.versions) < 1):
            raise InvalidSpecError("version policy specific: list versions >= 1, e.g. specific:1,2")
        if self.kind == "latest":
            check_range("the N of version policy latest:N", self.num_versions, 1, UINT32_MAX, "a uint32 (num_versions)")
        for version in self.versions if self.kind == "specific" else ():
            check_range("each version of version policy specific:V1,V2", version, 1, INT64_MAX,
                        "an int64 (a model version)")

    @classmethod
    def parse(cls, text: str) -> VersionPolicy:
        kind, _, arg = text.strip().partition(":")
        try:
            if kind == "all" and not arg:
                return cls(kind="all")
            if kind == "latest":
                return cls(kind="latest", num_versions=int(arg or 1))
            if kind == "specific":
                return cls(kind="specific", versions=tuple(int(v) for v in arg.split(",")))
        except ValueError:
            pass
        raise InvalidSpecError(
            f"invalid version policy {text!r}: expected 'latest:N', 'all' or 'specific:1,2'"
        )


# Two instances by default: with a single instance, Triton 2.51's dynamic batcher can leave a request that
# arrives while the instance is finishing its previous batch in its queue for the batcher's 500 ms idle wait.
# Measured on the local Triton, 8 s at 32 clients: one instance held 300-380 requests ~500 ms (about a dozen
# pauses of the whole model), two instances 0-64 (0-2 pauses); at 1 client the classifier went 40 -> 200 req/s.
# Two instances also overlap one batch's input/output handling with the next batch's compute.
DEFAULT_INSTANCES = 2
DEFAULT_QUEUE_DELAY_US = 2000
"""The dynamic batcher's ``max_queue_delay_microseconds`` where ``max_queue_delay_us`` is left out."""


@dataclass(frozen=True)
class ExportOptions:
    """Everything about an export except the module and its example inputs."""

    name: str
    repository: str = "model_repository"
    format: Format = "onnx"
    max_batch_size: int = 32
    """0: the model has no batch dim (Triton's ``max_batch_size: 0``): clients send whole tensors, dims are their full
    shapes, and there is no dynamic batcher."""
    version: int | None = None
    instances: int = DEFAULT_INSTANCES
    kind: Kind = "cpu"
    version_policy: VersionPolicy = field(default_factory=VersionPolicy)
    max_queue_delay_us: int | None = None
    """``None``: ``DEFAULT_QUEUE_DELAY_US`` for a batched model; an unbatched one has no queue delay to set."""
    preferred_batch_sizes: tuple[int, ...] = ()
    priority_levels: int = 0
    """Triton's dynamic-batching ``priority_levels`` (0: none): requests name 1 (highest) .. N; the default level
    is the middle one, as the gateway's ``default_priority`` of its ``priority_levels``."""
    atol: float | None = None
    rtol: float | None = None
    opset: int | None = None
    allow_fake_quant: bool = False
    release: bool | None = None
    """Whether a gateway starting with no routing state may serve the new version as stable by itself; ``None``:
    only when it is the model's first version (a later one serves once activated)."""

    def __post_init__(self) -> None:
        validate_model_name(self.name)
        self._check_types()
        if self.format not in ("onnx", "torchscript"):
            raise InvalidSpecError(f"invalid format {self.format!r}: expected 'onnx' or 'torchscript'")
        if self.kind not in ("cpu", "gpu"):
            raise InvalidSpecError(f"invalid instance kind {self.kind!r}: expected 'cpu' or 'gpu'")
        if self.max_batch_size < 0:
            raise InvalidSpecError(
                f"max_batch_size must be at least 1 for a model with a batch dim, or 0 for one without "
                f"(got {self.max_batch_size})"
            )
        if self.version is not None and self.version < 1:
            raise InvalidSpecError(f"version must be an integer >= 1 (got {self.version})")
        if self.instances < 1:
            raise InvalidSpecError(f"instances must be at least 1 (got {self.instances})")
        if self.max_queue_delay_us is not None and self.max_queue_delay_us < 0:
            raise InvalidSpecError(f"max_queue_delay_us must be >= 0 (got {self.max_queue_delay_us})")
        if not 0 <= self.priority_levels <= 100:
            raise InvalidSpecError(f"priority_levels must lie between 0 (none) and 100 (got {self.priority_levels})")
        if not self.batched:
            self._check_unbatched()
        # The proto's limits, after the checks above that name the lower bounds in their own words.
        check_range("max_batch_size", self.max_batch_size, 0, INT32_MAX, "an int32 (max_batch_size)")
        if self.version is not None:
            check_range("version", self.version, 1, INT64_MAX, "an int64 (a model version)")
        check_range("instances", self.instances, 1, INT32_MAX, "an int32 (instance_group count)")
        if self.max_queue_delay_us is not None:
            check_range("max_queue_delay_us", self.max_queue_delay_us, 0, UINT64_MAX,
                        "a uint64 (max_queue_delay_microseconds)")
        bad = [b for b in self.preferred_batch_sizes if not 1 <= b <= self.max_batch_size]
        if bad:
            raise InvalidSpecError(
                f"preferred batch sizes {bad} must lie between 1 and max_batch_size={self.max_batch_size}"
            )
        if self.opset is not None and self.opset < 1:
            raise InvalidSpecError(f"opset must be an ONNX opset version >= 1 (got {self.opset}), e.g. 17")
        for label, tol in (("atol", self.atol), ("rtol", self.rtol)):
            # NaN passes no comparison (every export would fail parity, blamed on rounding) and infinity passes
            # every one (a model answering anything would be published): neither is a tolerance.
            if tol is not None and not (math.isfinite(tol) and tol >= 0):
                raise InvalidSpecError(
                    f"{label} must be a finite number >= 0 (got {tol}); leave it out for the default (1e-4 for fp32 "
                    "models, 1e-2 for fp16/bf16)"
                )

    @property
    def batched(self) -> bool:
        """Whether the model has a batch dim (``max_batch_size`` over 0) and a dynamic batcher merges requests."""
        return self.max_batch_size > 0

    @property
    def queue_delay_us(self) -> int:
        return DEFAULT_QUEUE_DELAY_US if self.max_queue_delay_us is None else self.max_queue_delay_us

    def _check_unbatched(self) -> None:
        """Refuse the dynamic batcher's options for a model without a batch dim: Triton has no batcher to give them
        to there, so a config carrying them would promise batching that never happens."""
        given = [text for text, set_ in (
            (f"preferred_batch_sizes={list(self.preferred_batch_sizes)} (--preferred-batch-size)",
             bool(self.preferred_batch_sizes)),
            (f"priority_levels={self.priority_levels} (--priority-levels)", self.priority_levels != 0),
            (f"max_queue_delay_us={self.max_queue_delay_us} (--max-queue-delay-us)",
             self.max_queue_delay_us is not None),
        ) if set_]
        if given:
            raise InvalidSpecError(
                f"{' and '.join(given)} configure the dynamic batcher, but max_batch_size=0 exports a model without "
                "a batch dim, which Triton serves without one: leave them out, or give max_batch_size of 1 or more "
                "for a model whose first axis is the batch"
            )

    def _check_types(self) -> None:
        """Options from Python arrive unchecked (``instances=2.5``): refuse a wrong type naming the option, before a
        comparison or protobuf raises a bare TypeError; integer-valued numpy numbers become plain ints."""
        for label in ("max_batch_size", "instances", "max_queue_delay_us", "priority_levels", "version", "opset"):
            value = getattr(self, label)
            if value is None and label in ("version", "opset", "max_queue_delay_us"):
                continue
            object.__setattr__(self, label, _integer(label, value))
        object.__setattr__(self, "preferred_batch_sizes", batch_size_list(self.preferred_batch_sizes))
        for label in ("atol", "rtol"):
            value = getattr(self, label)
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
                raise InvalidSpecError(
                    f"{label} must be a number, e.g. 1e-4 (got {type(value).__name__} {value!r})"
                )
        if self.release is not None and not isinstance(self.release, bool):
            raise InvalidSpecError(
                f"release must be True, False or None (got {type(self.release).__name__} {self.release!r})"
            )


def batch_size_list(sizes: object) -> tuple[int, ...]:
    """``preferred_batch_sizes`` as given from Python (a list or tuple of integers) as the tuple an export holds."""
    if not isinstance(sizes, tuple | list):
        raise InvalidSpecError(
            f"preferred_batch_sizes must be a list of integers, e.g. [4, 8] (got {type(sizes).__name__} {sizes!r})"
        )
    return tuple(_integer("each of preferred_batch_sizes", b) for b in sizes)


def _integer(label: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidSpecError(f"{label} must be an integer (got {type(value).__name__} {value!r})")
    return int(value)
