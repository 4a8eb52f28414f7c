"""The floor plan holds: no import cycle anywhere in ``services`` (``TYPE_CHECKING`` and function-level imports
included), the gateway's packages import only downwards through the layers of docs/architecture.md, the gateway's
root stays small, and the client-side commands never import the server."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.import_graph import cycles, import_graph, layer_cycles, package_edges

GATEWAY = "services.gateway"
LAYERS: list[tuple[str, set[str]]] = [
    ("wiring", {"__init__", "cli", "settings_cli", "server", "app", "workers"}),
    ("edges", {"admin", "tuning", "rest", "grpc_api", "repository_api"}),
    ("data plane", {"dataplane"}),
    ("capacity", {"capacity"}),
    ("versions", {"versions", "state"}),
    ("admission", {"shaping"}),
    ("backends", {"backends", "statistics"}),
    ("batching", {"batching"}),
    ("foundation", {"repository", "tensors", "metrics", "tallies", "settings", "errors", "tracing", "inference_log",
                    "security"}),
]
"""Top to bottom, as docs/architecture.md draws them: a part may import its own layer and the layers below it."""
ROOT_MODULES_AT_MOST = 12


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph("services")


def test_no_module_imports_itself_back(graph: dict[str, set[str]]) -> None:
    assert cycles(graph) == []


def test_no_package_imports_a_package_that_imports_it_back(graph: dict[str, set[str]]) -> None:
    assert layer_cycles(graph) == {}


def test_gateway_imports_only_downwards(graph: dict[str, set[str]]) -> None:
    rank = {part: index for index, (_, parts) in enumerate(LAYERS) for part in parts}
    inside = {name for name in graph if name == GATEWAY or name.startswith(f"{GATEWAY}.")}
    gateway = {name: targets & inside for name, targets in graph.items() if name in inside}
    edges = package_edges(gateway, GATEWAY)
    unplaced = sorted({part for edge in edges for part in edge} - rank.keys())
    assert unplaced == [], f"parts of the gateway with no layer in LAYERS (and docs/architecture.md): {unplaced}"
    upwards = sorted(f"{a} ({LAYERS[rank[a]][0]}) -> {b} ({LAYERS[rank[b]][0]})" for a, b in edges if rank[b] < rank[a])
    assert upwards == []


def test_gateway_root_holds_only_the_wiring() -> None:
    root = Path(__file__).resolve().parents[1] / "services" / "gateway"
    modules = sorted(path.name for path in root.glob("*.py"))
    assert len(modules) <= ROOT_MODULES_AT_MOST, modules


def test_client_side_commands_never_import_the_server(graph: dict[str, set[str]]) -> None:
    client = {name: sorted(t for t in targets if t.startswith(f"{GATEWAY}.") or t == GATEWAY)
              for name, targets in graph.items() if name.startswith("services.ops")}
    assert {name: targets for name, targets in client.items() if targets} == {}
    server = {name: sorted(t for t in targets if t.startswith("services.ops"))
              for name, targets in graph.items() if name.startswith(GATEWAY)}
    assert {name: targets for name, targets in server.items() if targets} == {}


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_cycle_behind_type_checking_is_still_found(tmp_path: Path) -> None:
    _tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.b import thing\n",
        "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import other\nthing = 1\n",
        "pkg/c.py": "def late():\n    from . import a\n",
    })
    assert cycles(import_graph("pkg", tmp_path)) == [["pkg.a", "pkg.b"]]


def test_a_cycle_between_packages_is_found_where_no_two_modules_form_one(tmp_path: Path) -> None:
    _tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/low/__init__.py": "",
        "pkg/low/one.py": "from pkg.high.two import x\n",
        "pkg/low/three.py": "y = 1\n",
        "pkg/high/__init__.py": "",
        "pkg/high/two.py": "x = 1\n",
        "pkg/high/four.py": "from ..low import three\n",
    })
    graph = import_graph("pkg", tmp_path)
    assert cycles(graph) == []
    assert layer_cycles(graph) == {"pkg": [["high", "low"]]}
