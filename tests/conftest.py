"""Session-wide fixtures shared by the test packages, and the hooks that keep the ``slow`` marker honest
(tests/slow_work.py) and share the suite between pytest-xdist's workers (tests/xdist_groups.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import slow_work
from tests.shared_exports import SharedExamples, Snapshot, shared_examples
from tests.shared_tls import share_default_context

share_default_context()


@pytest.fixture(scope="session")
def shared_example_export(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedExamples]:
    """The examples, exported once per run (by whichever xdist worker needs them first). Fails the last test of
    the session when a test wrote to them: a test that changes a repository works on a copy."""
    shared = shared_examples(tmp_path_factory)
    before = Snapshot(shared.repository)
    yield shared
    changed = before.changes()
    assert not changed, f"a test changed the shared example repository {shared.repository}: {changed[:10]}"


@pytest.fixture(scope="session")
def example_repository(shared_example_export: SharedExamples) -> Path:
    """What `make models` writes (classifier and mlp, ONNX versions 1 and 2, policy ``all``), plus
    ``mlp_ts``: the MLP as TorchScript version 1. Exported once per test run; read-only (copy what you change)."""
    return shared_example_export.repository


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        # The xdist controller, before it starts the workers (which inherit this, as do their subprocesses): with a
        # worker per core, torch's OpenMP threads (one per core in each process) spin-wait against the other
        # worker's; one each leaves the cores to the workers (the exporter tests: 101 s -> 82 s on two cores).
        os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadgroup``: the groups of tests/xdist_groups.py, longest first."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from tests.xdist_groups import SharedServerScheduling

    return SharedServerScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput") and config.getvalue("loadgroup"):  # an xdist worker of `make pytest`
        from tests.xdist_groups import longest_first

        items[:] = longest_first(items)


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[object]) -> Iterator[None]:
    with slow_work.setting_up(fixturedef):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with slow_work.running(item):
        slow_work.check_fixtures(item)
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with slow_work.running(item), slow_work.exports_refused(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    with slow_work.running(item):
        yield
