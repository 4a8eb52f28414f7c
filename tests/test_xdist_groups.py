"""The order in which ``make pytest`` hands its test groups to the workers (tests/xdist_groups.py)."""

from __future__ import annotations

from dataclasses import dataclass

from tests.xdist_groups import SHARED_TRITON, TUNERS, group_of, longest_first


@dataclass
class _Item:
    nodeid: str


ITEMS = [
    _Item("tests/gateway/test_small.py::test_a"),  # no cost recorded: last of its kind
    _Item("tests/integration/test_ops_console.py::test_a"),
    _Item("tests/integration/test_tune_embedded.py::test_a"),  # a tuning run
    _Item("tests/integration/test_zoo_serving.py::test_a"),
    _Item("tests/triton/test_repository_api_triton.py::test_a"),
    _Item("tests/triton/test_serving.py::test_a"),  # the shared-Triton group
    _Item("tests/triton/test_serving.py::test_b"),
    _Item("tests/triton/test_tune_triton.py::test_a"),  # a tuning run
    _Item("tests/tritonlocal/test_lifecycle.py::test_a"),
]


def test_groups_go_out_longest_first_with_triton_groups_taking_turns_with_the_others() -> None:
    ordered = [group_of(item.nodeid) for item in longest_first(ITEMS)]  # type: ignore[arg-type]
    assert list(dict.fromkeys(ordered)) == [
        TUNERS,
        "tests/integration/test_ops_console.py",
        SHARED_TRITON,
        "tests/integration/test_zoo_serving.py",
        "tests/triton/test_repository_api_triton.py",
        "tests/gateway/test_small.py",
        "tests/tritonlocal/test_lifecycle.py",
    ]


def test_a_groups_tests_stay_together_in_collection_order() -> None:
    nodeids = [item.nodeid for item in longest_first(ITEMS)]  # type: ignore[arg-type]
    tuning = ["tests/integration/test_tune_embedded.py::test_a", "tests/triton/test_tune_triton.py::test_a"]
    assert nodeids[:2] == tuning
    assert nodeids[3:5] == ["tests/triton/test_serving.py::test_a", "tests/triton/test_serving.py::test_b"]


def test_no_items_is_no_order() -> None:
    assert longest_first([]) == []
