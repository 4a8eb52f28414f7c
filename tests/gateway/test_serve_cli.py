"""``switchyard serve`` argument handling (the server itself is exercised by the integration tests)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from services.cli import app


def test_serve_exits_with_message_when_repository_missing(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["serve", "--repository", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "does not exist: give SWITCHYARD_REPOSITORY / --repository" in " ".join(result.output.split())


def test_serve_exits_with_message_when_backend_unknown(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["serve", "--repository", str(tmp_path), "--backend", "tensorflow"])
    assert result.exit_code == 2
    assert "choose embedded or triton" in result.output


def test_serve_lists_its_options_when_asked_for_help() -> None:
    result = CliRunner().invoke(app, ["serve", "--help"])
    assert result.exit_code == 0
    for option in ("--repository", "--backend", "--triton-url", "--host", "--port", "--grpc-port"):
        assert option in result.output
    assert "`switchyard settings` lists them all" in " ".join(result.output.split())


def test_serve_exits_with_one_line_per_problem_when_settings_invalid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWITCHYARD_DEFAULT_PRIORITY", "7")
    result = CliRunner().invoke(app, ["serve", "--repository", str(tmp_path)])
    assert result.exit_code == 2
    assert "SWITCHYARD_DEFAULT_PRIORITY must lie between 1 and SWITCHYARD_PRIORITY_LEVELS (3), got 7" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("variables", "expected"), [
    ({"SWITCHYARD_INFERENCE_LOG": "ftp://host/dir"},
     "SWITCHYARD_INFERENCE_LOG must be file:///abs/dir, redis://host:port/db?stream=NAME or an http(s):// URL"),
    ({"SWITCHYARD_INFERENCE_LOG": "redsi://:hunter2@host:6379/0"},  # a typo in the scheme: the password stays out
     "URL, got 'redsi://:<password>@host:6379/0'"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
     "OTEL_EXPORTER_OTLP_PROTOCOL is 'http/json'; expected one of http/protobuf, grpc"),
])
def test_serve_exits_with_one_line_when_the_inference_log_or_tracing_is_misconfigured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], expected: str
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SWITCHYARD_STATE_PATH", str(tmp_path / "state" / "routing.json"))
    (tmp_path / "repository").mkdir()
    result = CliRunner().invoke(app, ["serve", "--repository", str(tmp_path / "repository"), "--port", "0",
                                      "--grpc-port", "0"])
    assert result.exit_code == 2, result.output
    assert expected in result.output
    assert "Traceback" not in result.output


def test_serve_exits_with_message_when_keys_file_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWITCHYARD_API_KEYS_FILE", str(tmp_path / "keys.txt"))
    monkeypatch.setenv("SWITCHYARD_STATE_PATH", str(tmp_path / "state" / "routing.json"))
    (tmp_path / "repository").mkdir()
    result = CliRunner().invoke(app, ["serve", "--repository", str(tmp_path / "repository")])
    assert result.exit_code == 2
    assert result.output.startswith("error: ")
    assert "keys.txt" in result.output


@pytest.mark.parametrize(
    "content",
    ["[" * 3000 + "]" * 3000, '{"format": 1, "models": {"m": {"stable": %s}}}' % ("[" * 1000 + "]" * 1000),
     '{"format": 1, "models": {"m": {"stable": %s}}}' % ("9" * 5000)],
    ids=["3000-brackets", "1000-levels-in-a-record", "5000-digits"],
)  # fmt: skip
def test_serve_exits_with_message_when_state_file_is_nested_or_huge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str
) -> None:
    state = tmp_path / "state" / "routing.json"
    state.parent.mkdir()
    state.write_text(content)
    monkeypatch.setenv("SWITCHYARD_STATE_PATH", str(state))
    (tmp_path / "repository").mkdir()
    result = CliRunner().invoke(app, ["serve", "--repository", str(tmp_path / "repository")])
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: the state file {state} "), result.output
    assert result.output.rstrip().endswith("fix or remove the file"), result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("name", ["MAX_HEADER_BYTES", "MAX_HEADER_LINE_BYTES", "MAX_HEADER_COUNT"])
def test_serve_exits_with_message_when_a_head_limit_is_not_positive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(f"SWITCHYARD_{name}", "0")
    result = CliRunner().invoke(app, ["serve", "--repository", str(tmp_path)])
    assert result.exit_code == 2
    assert f"SWITCHYARD_{name} must be at least 1, got 0" in result.output
