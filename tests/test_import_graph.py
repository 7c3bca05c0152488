"""The package's import graph, read statically (imports inside functions count: a lazy import that only
dodges a cycle is still a cycle), has no circle through ``dlmrl.config``."""

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


def test_config_error_is_one_class():
    from dlmrl.config import ConfigError
    from dlmrl.errors import ConfigError as Base

    assert ConfigError is Base
