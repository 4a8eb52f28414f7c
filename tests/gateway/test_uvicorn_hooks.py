"""The REST edge builds on uvicorn's httptools protocol (``rest/connections.py`` overrides its parser callbacks and
``_start_asgi_task``; ``rest/direct.py`` answers through the request cycle's fields). Those are internals, so uvicorn
is pinned to the minor version they were read from; this test fails loudly, naming what moved, when an upgrade
changes them, before any request finds out."""

from __future__ import annotations

import inspect
import re
import tomllib
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from services.gateway.rest.direct import DirectAnswer

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL_METHODS = (
    "connection_made", "connection_lost", "data_received", "on_message_begin", "on_url", "on_header",
    "on_headers_complete", "on_message_complete", "on_response_complete", "_start_asgi_task", "_should_upgrade",
    "_unsupported_upgrade_warning", "handle_websocket_upgrade", "timeout_keep_alive_handler",
)
PROTOCOL_FIELDS = (
    "cycle", "parser", "pipeline", "flow", "transport", "server_state", "expect_100_continue", "headers", "url",
    "config", "logger", "timeout_keep_alive_task",
)
CYCLE_FIELDS = (
    "scope", "transport", "flow", "default_headers", "keep_alive", "disconnected", "response_started",
    "response_complete", "waiting_for_100_continue", "body", "more_body", "message_event", "on_response",
)
CYCLE_METHODS = ("receive", "send", "send_500_response")


def test_uvicorn_is_pinned_to_the_minor_version_whose_internals_the_edge_uses() -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pin = next(d for d in dependencies if d.startswith("uvicorn"))
    low, high = re.fullmatch(r"uvicorn\[standard\]>=(\d+\.\d+),<(\d+\.\d+)", pin).groups()  # type: ignore[union-attr]
    installed = tuple(int(part) for part in version("uvicorn").split(".")[:2])
    assert tuple(int(p) for p in low.split(".")) <= installed < tuple(int(p) for p in high.split("."))


def test_the_protocol_still_has_every_hook_the_edge_overrides_or_calls() -> None:
    missing = [name for name in PROTOCOL_METHODS if not callable(getattr(HttpToolsProtocol, name, None))]
    assert missing == [], f"uvicorn's HttpToolsProtocol lost: {missing}"
    source = inspect.getsource(HttpToolsProtocol)
    gone = [name for name in PROTOCOL_FIELDS if f"self.{name} " not in source and f"self.{name}:" not in source]
    assert gone == [], f"uvicorn's HttpToolsProtocol no longer sets: {gone}"


def test_the_request_cycle_still_has_every_field_the_direct_answer_uses() -> None:
    missing = [name for name in CYCLE_METHODS if not callable(getattr(RequestResponseCycle, name, None))]
    assert missing == [], f"uvicorn's RequestResponseCycle lost: {missing}"
    source = inspect.getsource(RequestResponseCycle.__init__)
    gone = [name for name in CYCLE_FIELDS if f"self.{name} " not in source and f"self.{name}:" not in source]
    assert gone == [], f"uvicorn's RequestResponseCycle no longer sets: {gone}"


def test_the_direct_answer_refuses_a_header_name_or_value_that_would_split_the_head() -> None:
    answer = DirectAnswer(cast(Any, SimpleNamespace(keep_alive=True)))
    good = answer._checked_head({"status": 200, "headers": [(b"x-model-version", b"1")]}, 0, b"")
    assert good == b"HTTP/1.1 200 OK\r\nx-model-version: 1\r\ncontent-length: 0\r\n\r\n"
    for name, value in ((b"x-bad name", b"1"), (b"x-split\r\nset-cookie", b"1"), (b"", b"1"), (b"x-ok", b"1\r\nx: 2")):
        with pytest.raises(RuntimeError, match="invalid"):
            answer._checked_head({"status": 200, "headers": [(name, value)]}, 0, b"")
