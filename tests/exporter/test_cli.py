"""The ``switchyard export`` command as a user runs it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from typer.testing import CliRunner

from exporter.model_config import read_config
from services.cli import app
from tests.shared_exports import copy_examples

pytestmark = pytest.mark.slow  # exports models

ROOT = Path(__file__).parents[2]


def switchyard(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, check=False)


def test_cli_export_prints_summary_when_export_succeeds(repo: Path) -> None:
    done = switchyard("export", "examples.models:build_mlp", "--name", "mlp", "--repository", str(repo),
                      "--input", "features:FP32:32", "--version-policy", "all")

    assert done.returncode == 0, done.stderr
    assert "mlp version 1" in done.stdout
    assert "probabilities" in done.stdout
    assert "parity against eager PyTorch" in done.stderr
    assert (repo / "mlp" / "1" / "model.onnx").exists()
    caption = next(line for line in done.stdout.splitlines() if "parity at batch sizes" in line)
    assert caption.strip().endswith("]"), caption  # nothing dangling after the last item
    assert "not released" not in done.stdout  # a model's first version is released

    second = switchyard("export", "examples.models:build_mlp", "--name", "mlp", "--repository", str(repo),
                        "--input", "features:FP32:32", "--version-policy", "latest:2")
    assert second.returncode == 0, second.stderr
    said = " ".join(second.stdout.split())
    assert ("version 2 is not released: it serves unversioned requests once activated (switchyard models activate "
            "mlp 2)") in said
    # The shared config.pbtxt changed for version 1 too: said, one line per field.
    assert ("config.pbtxt changed for every version of mlp: version_policy: { all { } } -> { latest { num_versions: "
            "2 } }") in said


def test_cli_export_prints_one_paragraph_without_traceback_when_input_is_bad(repo: Path) -> None:
    done = switchyard("export", "examples.models:build_mlp", "--name", "mlp", "--repository", str(repo),
                      "--input", "features:FP32:thirty-two")

    assert done.returncode == 1
    assert "export failed: invalid shape 'thirty-two'" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (repo / "mlp").exists()


@pytest.mark.parametrize("rows", ["0", "-3"])
def test_cli_export_prints_one_paragraph_without_traceback_when_example_batch_is_not_a_row_count(
    repo: Path, rows: str
) -> None:
    done = switchyard("export", "examples.models:build_mlp", "--name", "mlp", "--repository", str(repo),
                      "--input", "features:FP32:32", "--example-batch", rows)

    assert done.returncode == 1
    assert f"export failed: --example-batch must be at least 1 (got {rows})" in " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr
    assert not (repo / "mlp").exists()


def test_cli_export_explains_missing_inputs_when_factory_returns_only_a_module(repo: Path) -> None:
    done = switchyard("export", "examples.models:build_mlp", "--name", "mlp", "--repository", str(repo))

    assert done.returncode == 1
    assert "describe its inputs with --input NAME:DTYPE:SHAPE" in done.stderr
    assert "Traceback" not in done.stderr


def test_cli_export_shows_traceback_when_debug_is_set(repo: Path) -> None:
    done = switchyard("export", "examples.nope:build", "--name", "mlp", "--repository", str(repo), "--debug")

    assert done.returncode == 1
    assert "Traceback" in done.stderr
    assert "InvalidSpecError" in done.stderr


# An install without the `export` extra, as the command meets it: importing these modules fails.
WITHOUT_EXTRA = textwrap.dedent(
    """
    import sys
    for name in sys.argv[1].split(","):
        sys.modules[name] = None
    sys.argv = ["switchyard", "export", "examples.models:build_mlp", "--name", "mlp", "--repository", sys.argv[2],
                "--input", "features:FP32:32"]
    from services.cli import main
    main()
    """
)


@pytest.mark.parametrize("missing", [("torch", "onnx", "onnxscript"), ("onnxscript",)])
def test_cli_export_names_the_extra_in_one_line_when_toolchain_is_missing(repo: Path, missing: tuple[str, ...]) -> None:
    done = subprocess.run([sys.executable, "-c", WITHOUT_EXTRA, ",".join(missing), str(repo)], capture_output=True,
                          text=True, cwd=ROOT, timeout=300, check=False)

    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"error: switchyard export needs the 'export' extra ({missing[0]} is not installed): "
        "pip install 'switchyard[export]'"
    ]
    assert done.stdout == ""
    assert not repo.exists()


def test_cli_export_names_outputs_in_order_when_output_is_repeated(repo: Path) -> None:
    done = switchyard("export", "examples.models:build_mlp", "--name", "mlp", "--repository", str(repo),
                      "--input", "features:FP32:32", "--output", "scores", "--output", "probs")

    assert done.returncode == 0, done.stderr
    config = (repo / "mlp" / "config.pbtxt").read_text()
    assert config.index('name: "scores"') < config.index('name: "probs"')


def test_cli_export_names_each_differing_tensor_when_the_signature_conflicts(
    repo: Path, example_repository: Path
) -> None:
    copy_examples(example_repository, repo, ("mlp",))  # exported as above: features in, logits and probabilities out

    done = switchyard("export", "examples.models:build_mlp", "--name", "mlp", "--repository", str(repo),
                      "--input", "features:FP32:32", "--output", "scores", "--output", "probabilities")

    assert done.returncode == 1
    message = " ".join(done.stderr.split())
    assert "output 0: logits FP32 [8] there, scores FP32 [8] here" in message
    assert "output 1" not in message  # probabilities matches on both sides
    assert "--name" in message
    assert "--output" in message
    assert sorted(p.name for p in (repo / "mlp").iterdir() if p.name.isdigit()) == ["1", "2"]


def test_cli_export_binds_inputs_by_name_and_fits_the_example_when_max_batch_size_is_one(repo: Path) -> None:
    done = CliRunner().invoke(app, [
        "export", "tests.exporter.cli_models:build_weighted", "--name", "weighted", "--repository", str(repo),
        "--input", "b:FP32:-1", "--input", "a:FP32:-1", "--max-batch-size", "1",  # no --example-batch
    ])

    assert done.exit_code == 0, done.output
    config = read_config(repo / "weighted")
    assert [(t.name, list(t.dims)) for t in config.input] == [("b", [-1]), ("a", [-1])]
    assert [list(t.dims) for t in config.output] == [[-1]]  # grown and checked at other lengths at batch 1 too
    session = ort.InferenceSession(str(repo / "weighted" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    answer = session.run(None, {"a": np.ones((1, 5), np.float32), "b": np.zeros((1, 5), np.float32)})[0]
    np.testing.assert_allclose(answer, 2.0)  # eager forward(a=1, b=0)


def test_cli_export_help_shows_one_value_per_option_when_an_option_repeats() -> None:
    # A list metavar (<list[str]>) invited `--input a:FP32:4 b:FP32:4` and `--preferred-batch-size 4,8`, which fail.
    done = CliRunner().invoke(app, ["export", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"})

    assert done.exit_code == 0, done.output
    text = " ".join(done.output.split())
    assert "<list[" not in text
    assert "--input NAME:DTYPE:SHAPE" in text
    assert "--output NAME" in text
    assert "--preferred-batch-size N" in text
    assert "repeat it for each input (--input a:FP32:4 --input b:FP32:4)" in text
    assert "repeat it for more (--preferred-batch-size 4 --preferred-batch-size 8)" in text


def test_cli_export_takes_input_shapes_as_whole_shapes_when_max_batch_size_is_0(repo: Path) -> None:
    done = CliRunner().invoke(app, [
        "export", "tests.exporter.cli_models:build_set_pooler", "--name", "sets", "--repository", str(repo),
        "--input", "x:FP32:-1,4", "--max-batch-size", "0",
    ], env={"COLUMNS": "200"})

    assert done.exit_code == 0, done.output
    config = read_config(repo / "sets")
    assert config.max_batch_size == 0
    assert not config.HasField("dynamic_batching")
    assert [list(t.dims) for t in config.input] == [[-1, 4]]  # -1 on axis 0: the shape holds no batch dim
    assert list(config.model_warmup[0].inputs["x"].dims) == [8, 4]  # generated at the whole shape, -1 as 8
    said = " ".join(done.output.split())
    assert "parity without a batch dim, at shapes x [8, 4] | x [9, 4] | x [10, 4]" in said


def test_cli_export_refuses_example_batch_when_max_batch_size_is_0(repo: Path) -> None:
    done = switchyard("export", "tests.exporter.cli_models:build_set_pooler", "--name", "sets", "--repository",
                      str(repo), "--input", "x:FP32:-1,4", "--max-batch-size", "0", "--example-batch", "4")

    assert done.returncode == 1
    assert ("export failed: --example-batch 4 gives the rows of a batch, but --max-batch-size 0 exports a model "
            "without a batch dim") in " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr
    assert not (repo / "sets").exists()
