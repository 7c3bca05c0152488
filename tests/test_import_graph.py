"""The package's import graph, read statically (imports inside functions count: a lazy import that only
dodges a cycle is still a cycle), has no circle: not through ``dlmrl.config``, not anywhere."""

from __future__ import annotations

import ast
from pathlib import Path

import dlmrl

ROOT = Path(dlmrl.__file__).parent


def import_graph() -> dict[str, set[str]]:
    """``module -> modules it imports`` over ``dlmrl`` (importing ``a.b.c`` also runs ``a.b``'s ``__init__``)."""
    files = {}
    for f in ROOT.rglob("*.py"):
        parts = ("dlmrl", *f.relative_to(ROOT).with_suffix("").parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    graph = {}
    for name, f in files.items():
        found = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        with_parents = {".".join(m.split(".")[:i]) for m in found for i in range(2, m.count(".") + 2)}
        graph[name] = {m for m in with_parents if m in files and m != name and not name.startswith(m + ".")}
    return graph


def reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m == goal:
            return True
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    return False


def test_config_is_on_no_import_circle():
    graph = import_graph()
    assert reaches(graph, "dlmrl.config", "dlmrl.models.lora")  # config validates LoRA's target-module syntax
    config = sorted(m for m in graph if m == "dlmrl.config" or m.startswith("dlmrl.config."))
    for name in config:
        outside = {m for m in graph[name] if m not in config}
        back = sorted(m for m in outside if any(reaches(graph, m, c) for c in config))
        assert back == [], f"modules imported by {name} that import the config package back: {back}"


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (each holds an import circle), by Tarjan's
    algorithm (iterative: the package is deep enough to hit Python's recursion limit otherwise)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_no_module_is_on_an_import_circle():
    graph = import_graph()
    # the circle this replaced: the Sudoku task -> its text form -> the text tasks -> the Sudoku task's module
    assert reaches(graph, "dlmrl.data.tasks", "dlmrl.data.sudoku_text")
    assert reaches(graph, "dlmrl.data.sudoku_text", "dlmrl.data.text_tasks")
    assert circles(graph) == []


def test_the_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_config_error_is_one_class():
    from dlmrl.config import ConfigError
    from dlmrl.errors import ConfigError as Base

    assert ConfigError is Base
