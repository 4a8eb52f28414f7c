"""A config's ``reshape``: the shape the model itself takes or gives for a tensor, when it differs from the dims the
config declares to clients (Triton's convention for a per-row scalar: ``dims: [1]`` with ``reshape { shape: [] }``,
so a request of shape [B, 1] reaches the model as [B]). Triton applies it in its core; the embedded backend wraps
its runner in ``Reshaped`` for the same effect."""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2

from services.gateway.backends.runners import Runner
from services.gateway.tensors.types import Array


def reshapes(config: model_config_pb2.ModelConfig) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """Per input, the model's shape (no batch dim) where a ``reshape`` is set; per output, the declared dims."""
    inputs = {t.name: tuple(t.reshape.shape) for t in config.input if t.HasField("reshape")}
    outputs = {t.name: tuple(t.dims) for t in config.output if t.HasField("reshape")}
    return inputs, outputs


class Reshaped:
    """A runner whose inputs are reshaped to the model's shapes and whose outputs back to the declared dims, the
    batch dim (when the model batches) kept as it comes."""

    def __init__(self, runner: Runner, config: model_config_pb2.ModelConfig) -> None:
        self._runner = runner
        self._batched = config.max_batch_size > 0
        self._inputs, self._outputs = reshapes(config)
        self.data_dependent = runner.data_dependent

    def run(self, inputs: dict[str, Array]) -> dict[str, Array]:
        fed = {name: self._shaped(array, self._inputs[name]) if name in self._inputs else array
               for name, array in inputs.items()}
        results = self._runner.run(fed)
        return {name: self._shaped(array, self._outputs[name]) if name in self._outputs else array
                for name, array in results.items()}

    def _shaped(self, array: Array, dims: tuple[int, ...]) -> Array:
        # -1 in a reshape stands for whatever the element count leaves, as in Triton's; one per shape at most.
        return array.reshape((array.shape[0], *dims) if self._batched else dims)
