"""The exporter's model zoo end to end: every model exports with parity in each format that can carry it (or
is refused, naming the cause), and the embedded backend serves each export with eager PyTorch's numbers."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from torch.utils import _pytree as pytree

from examples.zoo import FORMATS, ZOO, ZooModel, ZooRow, export_zoo, problems
from examples.zoo.run import markdown_table
from exporter.parity import random_like
from services.gateway.settings import Settings
from services.modelrepo.manifest import read_manifest
from tests.gateway_harness import RunningGateway, running_gateway

pytestmark = pytest.mark.slow

BATCH = 3
GROW = 3
"""Requests grow each dynamic axis by this much over the example: sizes the parity gate never checked."""
SERVED = [pytest.param(m, f, id=f"{m.name}_{f}") for m in ZOO for f in FORMATS if f not in m.refused]

Array = npt.NDArray[Any]


class Zoo(NamedTuple):
    repository: Path
    rows: dict[str, ZooRow]
    """By served model name (``<model>_<format>``)."""


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Zoo:
    root = tmp_path_factory.mktemp("zoo")
    started = time.perf_counter()
    rows = export_zoo(root)
    print(f"\n{markdown_table(rows)}\nzoo exported in {time.perf_counter() - started:.0f} s")
    return Zoo(root, {row.served_name: row for row in rows})


@pytest.fixture(scope="module")
def gateway(zoo: Zoo) -> Iterator[RunningGateway]:
    with running_gateway(Settings(repository=zoo.repository, port=0, grpc_port=0)) as running:
        yield running


def test_zoo_exports_every_model_with_parity_or_a_named_refusal_when_exported_in_one_process(zoo: Zoo) -> None:
    rows = zoo.rows

    assert problems(rows.values()) == []
    assert sorted(rows) == sorted(f"{m.name}_{f}" for m in ZOO for f in FORMATS)
    for row in rows.values():
        if row.result is not None:
            assert row.result.parity.passed
            assert row.result.max_abs_error <= 1e-4, row.served_name


@pytest.mark.parametrize(("model", "fmt"), SERVED)
def test_zoo_model_answers_like_eager_pytorch_when_served_by_the_embedded_backend(
    zoo: Zoo, gateway: RunningGateway, model: ZooModel, fmt: str
) -> None:
    row = zoo.rows[f"{model.name}_{fmt}"]
    assert row.result is not None, row.refusal
    inputs = _fresh_inputs(row)
    with torch.no_grad():
        module = model.build()
        raw = module(**inputs) if isinstance(model.example(), Mapping) else module(*inputs.values())
    expected = [t.numpy() for t in pytree.tree_leaves(raw)]
    served = {spec.name: value.numpy() for spec, value in zip(row.result.inputs, inputs.values(), strict=True)}
    outputs = [spec.name for spec in row.result.outputs]
    check = row.result.parity.checks[0]  # the gate's tolerance

    for client_module, url in ((httpclient, gateway.http_url), (grpcclient, gateway.grpc_url)):
        answer = _infer(client_module, url, row, served, outputs)
        for name, got, want in zip(outputs, answer, expected, strict=True):
            assert got.dtype == want.dtype, name
            np.testing.assert_allclose(got, want, rtol=check.rtol, atol=check.atol, err_msg=f"{row.served_name}:{name}")


def _fresh_inputs(row: ZooRow) -> dict[str, torch.Tensor]:
    """Other values, batch size and dynamic sizes than the export saw, drawn as the parity gate draws them;
    keyed by the model's own input names, in forward's order."""
    assert row.result is not None
    example = row.model.example()
    tensors = list(example.values()) if isinstance(example, Mapping) else list(pytree.tree_leaves(example))
    generator = torch.Generator().manual_seed(99)
    fresh = {}
    for spec, source, tensor in zip(row.result.inputs, _sources(row), tensors, strict=True):
        dynamic = [axis + 1 for axis, dim in enumerate(spec.dims) if dim == -1]
        fresh[source] = random_like(tensor, BATCH, generator, dynamic, grow=GROW)
    return fresh


def _sources(row: ZooRow) -> list[str]:
    """The model's own input names (forward's parameters, or the example dict's keys) in served order."""
    assert row.result is not None
    return [entry.source for entry in read_manifest(row.result.model_dir).inputs]


def _infer(
    client_module: ModuleType, url: str, row: ZooRow, inputs: dict[str, Array], outputs: list[str]
) -> list[Array]:
    """One request through ``tritonclient.http`` or ``tritonclient.grpc`` (the same calls in both)."""
    client = client_module.InferenceServerClient(url)
    try:
        tensors = []
        for name, value in inputs.items():
            tensor = client_module.InferInput(name, list(value.shape), _datatype(row, name))
            tensor.set_data_from_numpy(value)
            tensors.append(tensor)
        result = client.infer(row.served_name, tensors)
    finally:
        client.close()
    return [result.as_numpy(name) for name in outputs]


def _datatype(row: ZooRow, name: str) -> str:
    assert row.result is not None
    return next(spec.datatype for spec in row.result.inputs if spec.name == name)
