"""What ``switchyard export MODULE:FACTORY`` says when the factory cannot be imported: where it looked and how to
make it look elsewhere, unless the module was found and its own import failed."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.errors import InvalidSpecError
from exporter.factory import build


def test_a_module_not_found_names_the_folder_searched_and_the_ways_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)

    with pytest.raises(InvalidSpecError) as refused:
        build("tiny:build", ["x:FP32:4"], 2)

    assert str(refused.value) == (
        f"cannot load 'tiny:build': no module 'tiny' in the current folder ({tmp_path}) nor on PYTHONPATH. Run the "
        "command from the folder that holds tiny.py (or its package), or add that folder to PYTHONPATH; --repository "
        "is relative to the current folder too."
    )


def test_a_module_whose_own_import_fails_says_that_instead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "needs_more.py").write_text("import a_package_nobody_installed\n")
    monkeypatch.chdir(tmp_path)

    with pytest.raises(InvalidSpecError) as refused:
        build("needs_more:build", ["x:FP32:4"], 2)

    assert str(refused.value) == (
        "cannot load 'needs_more:build': importing it failed: No module named 'a_package_nobody_installed'"
    )
