"""How ``make pytest`` shares the suite between pytest-xdist's workers (``-n 4 --dist loadgroup``; the conftest
hook hands xdist this scheduler). A group is what one worker runs from start to end:

- the files of ``SHARED``, whose tests share tests/triton/conftest.py's local Triton: one worker starts it once, and
  stops it as it moves on to other files (package scope: no idle server holds its stubs until the run ends);
- the files of ``SERIAL``, the tuning runs, which must not run beside each other;
- every other test file: its module fixtures start their servers once.

Groups go out longest first (``COST``, measured on the two-core machine), so that no worker is left with a long group
at the end while the other one idles; the rest follow in collection order. Groups that start a local Triton take
turns with the others, so that about two Tritons run at once rather than four. The ``xdist_group`` marker is not used:
with pytest 9 xdist cannot put it into the test ids its own loadgroup scheduler splits on."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import zip_longest

import pytest
from xdist.scheduler import LoadScopeScheduling

SHARED_TRITON = "tests/triton/ (shared Triton)"
SHARED = dict.fromkeys(
    (
        "tests/triton/test_deadlines.py",
        "tests/triton/test_decoupled_triton.py",
        "tests/triton/test_grpc_stream_triton.py",
        "tests/triton/test_hostile_shared_memory_triton.py",
        "tests/triton/test_http_transport.py",
        "tests/triton/test_import_boundaries.py",
        "tests/triton/test_kserve_sdk_triton.py",
        "tests/triton/test_serving.py",
        "tests/triton/test_shared_memory_triton.py",
        "tests/triton/test_triton_statistics.py",
    ),
    SHARED_TRITON,
)
"""Files whose tests use tests/triton/conftest.py's package Triton (``triton``, ``gateway``). A file left out of
this list still passes: its worker starts that Triton for it (seconds of CPU more)."""

TUNERS = "tests/ tuning runs (one at a time)"
SERIAL = dict.fromkeys(("tests/integration/test_tune_embedded.py", "tests/triton/test_tune_triton.py"), TUNERS)
"""Files whose tests time a tuning run against a budget and a latency target: run side by side, each one's load
generator slowed the other's trials past its budget (seen twice), so one worker runs them one after the other."""

COST = {
    SHARED_TRITON: 60,
    TUNERS: 97,
    "tests/deploy/test_base_install.py": 50,
    "tests/integration/test_zoo_serving.py": 45,
    "tests/triton/test_repository_api_triton.py": 37,
    "tests/integration/test_ops_console.py": 60,
    "tests/deploy/test_compose_topology.py": 30,
    "tests/tritonlocal/test_lifecycle.py": 30,
    "tests/integration/test_hostile_load.py": 25,
    "tests/integration/test_workers.py": 25,
    "tests/integration/test_model_cache.py": 22,
    "tests/integration/test_openapi_schemathesis.py": 22,
    "tests/loadtests/test_gpu_check.py": 26,
    "tests/exporter/test_cli.py": 45,
    "tests/integration/test_replicas.py": 24,
    "tests/triton/test_control.py": 24,
    "tests/triton/test_swap_under_load.py": 20,
    "tests/integration/test_connection_limits.py": 18,
    "tests/integration/test_locust_runs.py": 17,
    "tests/integration/test_swap_failures.py": 16,
    "tests/triton/test_replicas.py": 16,
    "tests/triton/test_bytes_warmup_triton.py": 15,
    "tests/triton/test_swap_failures.py": 15,
    "tests/tritonlocal/test_server.py": 15,
    "tests/triton/test_model_cache_triton.py": 14,
    "tests/exporter/test_export_log.py": 16,
    "tests/exporter/test_control_flow.py": 12,
    "tests/exporter/test_repeated_exports.py": 12,
    "tests/triton/test_bytes_triton.py": 12,
    "tests/triton/test_triton_examples_triton.py": 12,
    "tests/triton/test_faults.py": 11,
    "tests/exporter/test_examples.py": 10,
    "tests/integration/test_traffic_split.py": 10,
    "tests/tls/test_listeners.py": 12,
    "tests/gateway/test_batcher.py": 9,
    "tests/gateway/test_traffic_policies.py": 11,
    "tests/tritonlocal/test_triton_traces.py": 9,
    "tests/exporter/test_publish.py": 8,
    "tests/integration/test_no_secret_leaks.py": 8,
    "tests/triton/test_error_texts_triton.py": 8,
    "tests/triton/test_classification_triton.py": 7,
    "tests/integration/test_swap_under_load.py": 6,
    "tests/integration/test_triton_examples.py": 6,
    "tests/triton/test_foreign_repository.py": 6,
    "tests/exporter/test_export.py": 14,
    "tests/exporter/test_zoo.py": 9,
    "tests/integration/test_repository_under_load.py": 5,
    "tests/integration/test_traffic_cli.py": 5,
    "tests/integration/test_inference_log_sinks.py": 4,
    "tests/tls/test_triton_tls.py": 4,
    "tests/integration/test_ops_console_trouble.py": 31,
    "tests/integration/test_workers_failures.py": 26,
    "tests/deploy/test_prometheus_alerts.py": 13,
    "tests/tls/test_tls_files.py": 8,
    "tests/gateway/test_worker_supervisor.py": 8,
}
"""Seconds a group takes on the two-core machine, roughly (the larger of earlier figures and pytest --durations=0 summed
by file on 2026-12-05, again that evening); groups not named here take about 8 s or less."""


def group_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return SHARED.get(path) or SERIAL.get(path, path)


TRITON_PATHS = ("tests/triton/", "tests/tritonlocal/", "tests/tls/test_triton_tls.py")
"""Where the groups that start a local Triton live: each holds a dozen python-backend stubs, their /dev/shm regions
and their CPU while it runs."""


def starts_triton(group: str) -> bool:
    return group in (SHARED_TRITON, TUNERS) or group.startswith(TRITON_PATHS)


def longest_first(items: Sequence[pytest.Item]) -> list[pytest.Item]:
    """``items`` by their group's cost, longest first, the groups that start a local Triton taking turns with the
    others (one of each, then the next of each): the four workers start two Tritons at once, not four, and
    later on mostly stay near that (the longest groups of both kinds still go out first). Stable otherwise (a
    worker's collection order, the same on every worker, is the order the groups go out in)."""
    groups = list(dict.fromkeys(group_of(item.nodeid) for item in items))
    groups.sort(key=lambda group: -COST.get(group, 0))
    tritons = [group for group in groups if starts_triton(group)]
    others = [group for group in groups if not starts_triton(group)]
    turns = [group for pair in zip_longest(tritons, others) for group in pair if group is not None]
    rank = {group: index for index, group in enumerate(turns)}
    return sorted(items, key=lambda item: rank[group_of(item.nodeid)])


class SharedServerScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with ``group_of`` as the scope, the groups sent in collection order."""

    def __init__(self, config: pytest.Config, log: object = None) -> None:
        config.option.loadscopereorder = False  # keep longest_first's order, not the count of tests per group
        super().__init__(config, log)  # type: ignore[arg-type]

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)
