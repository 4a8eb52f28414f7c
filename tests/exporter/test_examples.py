"""What `make models` writes: both examples as versions 1 and 2, valid and faithful; and the README's export
commands, run after it in the README's order, all succeed."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from examples.export_examples import EXAMPLES, export_examples
from services.modelrepo.manifest import read_manifest, read_samples
from tests.shared_exports import SharedExamples, copy_examples

pytestmark = pytest.mark.slow  # the examples' export

ROOT = Path(__file__).parents[2]
FENCED = re.compile(r"```(\w*)\n(.*?)```", re.DOTALL)


@pytest.fixture(scope="module")
def examples_repo(shared_example_export: SharedExamples) -> tuple[Path, list[tuple[str, int]]]:
    """The session's export (``export_examples`` into an empty repository, then ``mlp_ts`` beside it) and what
    ``export_examples`` returned: (name, version) of each version it wrote."""
    return shared_example_export.repository, shared_example_export.written


def readme_exports() -> list[tuple[str, str]]:
    """The README's export commands in its order: ``("bash", command)`` or ``("python", snippet)``."""
    found = []
    for language, body in FENCED.findall((ROOT / "README.md").read_text()):
        if language == "bash":
            found += [("bash", line) for line in body.replace("\\\n", " ").splitlines()
                      if " export " in line and re.match(r"\s*(\.venv/bin/)?switchyard ", line)]
        elif language == "python" and "from exporter import export" in body:
            found.append(("python", body))
    return found


def test_export_examples_writes_two_differing_faithful_versions_when_repository_is_empty(
    examples_repo: tuple[Path, list[tuple[str, int]]], tmp_path: Path
) -> None:
    repo, written = examples_repo

    expected = [("classifier", 1), ("classifier", 2), ("mlp", 1), ("mlp", 2)]
    assert sorted(written) == expected
    for example in EXAMPLES:
        config = text_format.Parse((repo / example.name / "config.pbtxt").read_text(), mc.ModelConfig())
        assert config.version_policy.WhichOneof("policy_choice") == "all"
        assert config.max_batch_size == 32
        answers = []
        for version, build in example.versions.items():
            version_dir = repo / example.name / str(version)
            manifest = read_manifest(version_dir)
            assert manifest.parity["passed"]
            session = ort.InferenceSession(str(version_dir / "model.onnx"), providers=["CPUExecutionProvider"])
            batch = example.inputs(5, 42)
            got = session.run(None, {example.input_name: batch.numpy()})
            with torch.no_grad():
                eager = build()(batch)
            eager_first = eager if isinstance(eager, torch.Tensor) else next(iter(eager.values()))
            np.testing.assert_allclose(got[0], eager_first.numpy(), atol=1e-4, rtol=1e-4)
            samples = read_samples(version_dir, manifest.sample_inputs)
            assert samples[example.input_name].shape[0] == 2
            answers.append(got[0])
        assert not np.allclose(answers[0], answers[1]), f"{example.name} v1 and v2 must answer differently"

    assert export_examples(copy_examples(repo, tmp_path / "model_repository")) == []  # the shared one stays as it is


def test_readme_export_commands_succeed_when_run_after_the_examples_in_readme_order(
    examples_repo: tuple[Path, list[tuple[str, int]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy_examples(examples_repo[0], tmp_path / "model_repository")  # what `make serve` left, as the README has it
    monkeypatch.chdir(tmp_path)
    commands = readme_exports()
    assert [kind for kind, _ in commands] == ["bash", "python"]

    for kind, text in commands:
        if kind == "bash":
            argv = [sys.executable, "-m", "services", *shlex.split(text)[1:]]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
            assert done.returncode == 0, f"{text}\n{done.stderr}"
        else:
            exec(compile(text, "README.md", "exec"), {})  # noqa: S102 - the README's own snippet
    assert sorted(int(p.name) for p in (tmp_path / "model_repository" / "classifier").iterdir()
                  if p.name.isdigit()) == [1, 2, 3]
    assert (tmp_path / "model_repository" / "mlp" / "3" / "model.onnx").exists()
