"""The import graph of the project's own modules, read from the source with ``ast``: every import counts, including
the ones under ``if TYPE_CHECKING:`` and inside functions, because a cycle hidden there is still a cycle in the
design. Run as ``python -m tests.import_graph [PACKAGE]`` to print the cycles and the package-level edges."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules_under(package: str, root: Path = ROOT) -> dict[str, Path]:
    base = root.joinpath(*package.split("."))
    return {module_name(path, root): path for path in sorted(base.rglob("*.py"))}


def imported_names(path: Path, module: str) -> set[str]:
    """Every module name ``module`` imports (absolute, relative resolved), plus ``package.name`` for each
    ``from package import name`` so that importing a submodule through its package is seen."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_from(node, module, is_package)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _resolve_from(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    anchor = module.split(".") if is_package else module.split(".")[:-1]
    anchor = anchor[: len(anchor) - (node.level - 1)]
    return ".".join([*anchor, node.module] if node.module else anchor)


def import_graph(package: str, root: Path = ROOT) -> dict[str, set[str]]:
    """Module → the modules of ``package`` it imports. A package's ``__init__`` counts as the package's own node;
    importing ``a.b.c`` also depends on ``a.b`` and ``a`` (their ``__init__`` runs first)."""
    modules = modules_under(package, root)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for imported in imported_names(path, name):
            parts = imported.split(".")
            for end in range(len(parts), 0, -1):
                candidate = ".".join(parts[:end])
                if candidate in modules and candidate != name and not name.startswith(f"{candidate}."):
                    targets.add(candidate)
        graph[name] = targets
    return graph


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(graph.get(start, ())))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, pending = work[-1]
            if pending:
                child = pending.pop(0)
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, sorted(graph.get(child, ()))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def package_edges(graph: Mapping[str, Iterable[str]], package: str) -> set[tuple[str, str]]:
    """Edges between the first-level parts of ``package`` (a subpackage, or a module at its root)."""

    def part(module: str) -> str:
        rest = module.removeprefix(package).lstrip(".")
        return rest.split(".")[0] if rest else "__init__"

    return {(part(a), part(b)) for a, targets in graph.items() for b in targets if part(a) != part(b)}


def layer_cycles(graph: Mapping[str, Iterable[str]]) -> dict[str, list[list[str]]]:
    """For every package in ``graph``, the cycles among its first-level parts (subpackages and root modules): a
    package that imports another which imports it back is a cycle of layers even when no two modules form one."""
    packages = {name for name in graph if any(other.startswith(f"{name}.") for other in graph)}
    found: dict[str, list[list[str]]] = {}
    for package in sorted(packages):
        inside = {a: [b for b in targets if b.startswith(f"{package}.")] for a, targets in graph.items()
                  if a.startswith(f"{package}.")}
        edges: dict[str, set[str]] = {}
        for a, b in package_edges(inside, package):
            edges.setdefault(a, set()).add(b)
        if found_here := cycles(edges):
            found[package] = found_here
    return found


def main() -> None:
    package = sys.argv[1] if len(sys.argv) > 1 else "services"
    graph = import_graph(package)
    for component in cycles(graph):
        print("cycle:", " ".join(component))
    for inside, components in layer_cycles(graph).items():
        for component in components:
            print(f"layer cycle in {inside}:", " ".join(component))
    for a, b in sorted(package_edges(graph, package)):
        print(f"{a} -> {b}")


if __name__ == "__main__":
    main()
