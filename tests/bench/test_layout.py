"""bench/ holds its shared helpers once (bench/common.py) and its modules import one another
without a circle (issue 37: ftar and limits imported each other, parse_size was written twice
and free_port five times)."""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
SHARED = ("parse_size", "free_port", "load", "secret_file")


def bench_imports() -> dict[str, set[str]]:
    """{module: the bench modules it imports}, at the top or inside functions."""
    graph = {}
    for path in BENCH.glob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bench."):
                found.add(node.module.split(".")[1])
            elif isinstance(node, ast.ImportFrom) and node.module == "bench":
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("bench."))
        graph[path.stem] = found - {path.stem}
    return graph


def circle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of `graph` ([] when there is none)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str]:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [node, nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := visit(nxt, path + [node])):
                return found
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state and (found := visit(start, [])):
            return found
    return []


def test_the_circle_finder_finds_a_circle():
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) and not circle({"a": {"b"}, "b": {"c"}, "c": set()})


def test_bench_modules_import_one_another_without_a_circle():
    graph = bench_imports()
    assert graph["ftar"] >= {"common"} and "ftar" not in graph["limits"]
    assert circle(graph) == [], f"an import circle in bench/: {' -> '.join(circle(graph))}"


def test_the_shared_helpers_are_defined_once_in_bench_common():
    defined = {}
    for path in BENCH.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.lstrip("_") in SHARED:
                defined.setdefault(node.name.lstrip("_"), []).append(path.stem)
    assert defined == {name: ["common"] for name in SHARED}, defined
