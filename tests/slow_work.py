"""The ``slow`` marker, kept honest. ``make test-fast`` (``pytest -m "not slow"``) is the edit loop: it must leave out
every test that starts a server (a gateway on real ports or in a process, Triton, redis-server, prometheus), a
browser, an export (torch to ONNX or TorchScript), a fresh venv or a timed run. The helpers that do such work call
``slow_work``; the conftest hooks remember which fixtures did it as they were set up, so that every test using one
is held to the marker too, and catch exports made in a test's body. A test that does any of it without the marker
fails, naming what it did, instead of quietly slowing the fast set down."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

EXPORTERS = (("torch.onnx", "export"), ("torch.export", "export"), ("torch.jit", "script"), ("torch.jit", "trace"))
"""What every export (ours or torch's own) goes through: ONNX, torch.export, TorchScript by scripting or tracing."""

_running: list[pytest.Item] = []
_setting_up: list[Any] = []
"""The fixtures being set up (``FixtureDef``), innermost last."""
_slow_fixtures: dict[tuple[str, str], str] = {}
"""Fixtures seen doing slow work as they were set up (by where they are defined and name): what they did. A test
using one is slow even when an earlier test paid for its setup."""


def is_slow(item: pytest.Item) -> bool:
    return item.get_closest_marker("slow") is not None


def _refuse(item: pytest.Item, what: str) -> None:
    pytest.fail(f"{item.nodeid} {what} but is not marked slow: add `pytestmark = pytest.mark.slow` to its module "
                "or `@pytest.mark.slow` to it (tests/slow_work.py)", pytrace=False)


def _key(fixturedef: Any) -> tuple[str, str]:
    return str(fixturedef.baseid), str(fixturedef.argname)


def slow_work(what: str) -> None:
    """Called by a helper as it starts slow work (``what``: "starts a gateway on real ports", ...)."""
    if _setting_up:
        _slow_fixtures.setdefault(_key(_setting_up[-1]), what)
    if _running and not is_slow(_running[-1]):
        _refuse(_running[-1], what)


def check_fixtures(item: pytest.Item) -> None:
    """Before a fast test's setup: it must not use a fixture already seen doing slow work (one it sets up itself
    is caught as the fixture does it)."""
    if is_slow(item):
        return
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return
    for name in item.fixturenames:  # type: ignore[attr-defined]
        for fixturedef in info.name2fixturedefs.get(name, ())[-1:]:
            what = _slow_fixtures.get(_key(fixturedef))
            if what is not None:
                _refuse(item, f"{what} (fixture {name!r})")


@contextmanager
def setting_up(fixturedef: Any) -> Iterator[None]:
    _setting_up.append(fixturedef)
    try:
        yield
    finally:
        _setting_up.pop()


@contextmanager
def running(item: pytest.Item) -> Iterator[None]:
    """While ``item``'s setup, call and teardown run: helpers' ``slow_work`` calls are checked against it."""
    _running.append(item)
    try:
        yield
    finally:
        _running.pop()


@contextmanager
def exports_refused(item: pytest.Item) -> Iterator[None]:
    """During a fast test's call: an export fails it (torch imported by then; a test importing it later escapes)."""
    if is_slow(item):
        yield
        return
    patched: list[tuple[Any, str, Any]] = []
    for module_name, attribute in EXPORTERS:
        module = sys.modules.get(module_name)
        if module is not None and hasattr(module, attribute):
            patched.append((module, attribute, getattr(module, attribute)))
            setattr(module, attribute, _refusing(item, f"{module_name}.{attribute}"))
    try:
        yield
    finally:
        for module, attribute, original in reversed(patched):
            setattr(module, attribute, original)


def _refusing(item: pytest.Item, name: str) -> Callable[..., Any]:
    def refuse(*args: object, **kwargs: object) -> Any:
        _refuse(item, f"exports a model ({name})")

    return refuse
