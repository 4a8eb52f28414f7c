"""What ``switchyard export`` is pointed at: a ``MODULE:FACTORY`` to import and call, and the ``--input``
specs that stand in for example inputs (random tensors) and declare the dynamic dims. An ``--input`` shape leaves
the batch dim out, as config.pbtxt does; for a model without one (``--max-batch-size 0``) it is the whole shape."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import torch

from exporter.dtypes import torch_dtype
from exporter.errors import InvalidSpecError
from exporter.specs import TensorSpec

DYNAMIC_DIM_EXAMPLE_SIZE = 8


def build(
    factory: str, inputs: list[str], example_batch: int | None
) -> tuple[torch.nn.Module, Any, list[str] | None]:
    """The module, its example inputs and their names (``None``: the factory's own examples name them).
    ``example_batch``: the rows of the generated inputs; ``None`` for a model without a batch dim, whose inputs
    are generated at their ``--input`` shapes."""
    if example_batch is not None and example_batch < 1:
        raise InvalidSpecError(f"--example-batch must be at least 1 (got {example_batch}): an example needs a row")
    module_name, _, attr = factory.partition(":")
    if not module_name or not attr:
        raise InvalidSpecError(f"invalid factory {factory!r}: expected MODULE:FACTORY, e.g. examples.models:build_mlp")
    sys.path.insert(0, str(Path.cwd()))
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module_name.startswith(exc.name):
            raise InvalidSpecError(f"cannot load {factory!r}: importing it failed: {exc}") from exc
        raise InvalidSpecError(
            f"cannot load {factory!r}: no module {module_name!r} in the current folder ({Path.cwd()}) nor on "
            f"PYTHONPATH. Run the command from the folder that holds {module_name.split('.')[0]}.py (or its "
            "package), or add that folder to PYTHONPATH; --repository is relative to the current folder too."
        ) from exc
    except (ImportError, AttributeError) as exc:
        raise InvalidSpecError(f"cannot load {factory!r}: {exc}") from exc
    finally:
        sys.path.pop(0)
    try:
        built = target()
    except Exception as exc:
        raise InvalidSpecError(f"the factory {factory} raised {type(exc).__name__}: {exc}") from exc
    module, examples = built if isinstance(built, tuple) else (built, None)
    specs = [TensorSpec.parse(text) for text in inputs]
    if specs:
        return module, tuple(_random_input(s, example_batch) for s in specs), [s.name for s in specs]
    if examples is None:
        raise InvalidSpecError(
            f"{factory} returned only a module: describe its inputs with --input NAME:DTYPE:SHAPE "
            "(e.g. --input image:FP32:3,64,64), or return (module, example_inputs) from the factory"
        )
    return module, examples, None


def dynamic_axes(inputs: list[str], batched: bool = True) -> dict[str, list[int]]:
    """Input name -> the axes its ``--input`` shape marks ``-1``, counting the batch axis as 0 when ``batched``
    (the shape leaves it out), else the shape's own axes."""
    first = 1 if batched else 0
    axes = {}
    for text in inputs:
        spec = TensorSpec.parse(text)
        dynamic = [i + first for i, d in enumerate(spec.dims) if d == -1]
        if dynamic:
            axes[spec.name] = dynamic
    return axes


def _random_input(spec: TensorSpec, batch: int | None) -> torch.Tensor:
    rows = () if batch is None else (batch,)
    shape = (*rows, *(DYNAMIC_DIM_EXAMPLE_SIZE if d == -1 else d for d in spec.dims))
    dtype = torch_dtype(spec.datatype)
    generator = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(dtype)
    # Small non-negative integers are valid indices for any embedding table.
    return torch.randint(0, 2, shape, generator=generator, dtype=dtype)
