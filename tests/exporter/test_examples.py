"""What `make models` writes: both examples as versions 1 and 2, valid and faithful."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from examples.export_examples import EXAMPLES, export_examples
from services.modelrepo.manifest import read_manifest, read_samples


def test_export_examples_writes_two_differing_faithful_versions_when_repository_is_empty(repo: Path) -> None:
    written = export_examples(repo)

    expected = [("classifier", 1), ("classifier", 2), ("mlp", 1), ("mlp", 2)]
    assert sorted((r.name, r.version) for r in written) == expected
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

    assert export_examples(repo) == []
