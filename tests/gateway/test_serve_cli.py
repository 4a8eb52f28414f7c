"""``switchyard serve`` argument handling (the server itself is exercised by the integration tests)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from services.cli import app


def test_serve_exits_with_message_when_repository_missing(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["serve", "--repository", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "does not exist (run `make models` first)" in result.output


def test_serve_exits_with_message_when_backend_unknown(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["serve", "--repository", str(tmp_path), "--backend", "tensorflow"])
    assert result.exit_code == 2
    assert "choose embedded or triton" in result.output


def test_serve_lists_its_options_when_asked_for_help() -> None:
    result = CliRunner().invoke(app, ["serve", "--help"])
    assert result.exit_code == 0
    for option in ("--repository", "--backend", "--triton-url", "--host", "--port", "--grpc-port"):
        assert option in result.output
