"""The launcher refuses, with the fix in the message, to start from a missing or unusable install."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from services.cli import app
from services.tritonlocal import LocalTriton, TritonInstall, TritonNotInstalled


def fake_install(home: Path, numpy: str) -> TritonInstall:
    binary = home / "server" / "pytriton" / "tritonserver" / "bin" / "tritonserver"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\nexit 1\n")
    binary.chmod(0o755)
    (home / "stubenv" / "bin").mkdir(parents=True)
    (home / "stubenv" / "bin" / "python3").write_text("")
    (home / "stubenv" / "pyvenv.cfg").write_text(f"home = {home / 'base' / 'bin'}\n")
    (home / "stubenv" / "lib" / "python3.11" / "site-packages" / f"numpy-{numpy}.dist-info").mkdir(parents=True)
    (home / "base" / "lib").mkdir(parents=True)
    (home / "base" / "lib" / "libpython3.11.so.1.0").write_text("")
    return TritonInstall(home)


def test_check_names_the_install_step_when_nothing_is_installed(tmp_path: Path) -> None:
    with pytest.raises(TritonNotInstalled, match="make install"):
        TritonInstall(tmp_path).check()


def test_check_refuses_when_the_stub_env_has_numpy_2(tmp_path: Path) -> None:
    with pytest.raises(TritonNotInstalled, match=r"numpy 2\.1\.0.*needs numpy < 2"):
        fake_install(tmp_path, "2.1.0").check()


def test_check_passes_when_the_stub_env_has_numpy_1(tmp_path: Path) -> None:
    install = fake_install(tmp_path, "1.26.4")
    install.check()
    assert install.base_lib() == tmp_path / "base" / "lib"


def test_start_refuses_before_building_anything_when_the_install_is_missing(tmp_path: Path) -> None:
    server = LocalTriton(tmp_path / "repo", derived=tmp_path / "derived", install=TritonInstall(tmp_path / "none"))
    with pytest.raises(TritonNotInstalled):
        server.start()
    assert server.pid is None
    assert not (tmp_path / "derived").exists()


def test_cli_exits_2_with_the_fix_when_the_install_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWITCHYARD_TRITON_HOME", str(tmp_path / "none"))
    result = CliRunner().invoke(app, ["triton", "--repository", str(tmp_path), "--http-port", "0"])
    assert result.exit_code == 2
    assert "make install" in result.output
