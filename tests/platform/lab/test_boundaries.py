"""Who may import whom (docs/architecture.md, "Boundaries"): the web tier under `platform/` never
imports `workers/` (it sends tasks by name, `execution.messages`), the worker never imports the
sweep module (it re-validates a run's config through `Run.run_config`), rollout workers never
import the trainer, and no module of `rlcore/`, `workers/` or `platform/` is part of an import
circle (every import counts: at module level, inside functions, under `TYPE_CHECKING`)."""

from __future__ import annotations

import ast
from pathlib import Path

from support import REPO


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, at module level or inside functions."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def module_name(path: Path) -> str:
    """The dotted name `path` is imported by (`platform/` is a source root, not a package)."""
    rel = path.relative_to(REPO / "platform" if path.is_relative_to(REPO / "platform") else REPO)
    parts = list(rel.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(folders: list[Path]) -> dict[str, set[str]]:
    """Each module under `folders` (migrations aside) → the modules among them it imports: for
    `from a.b import c` that is `a.b.c` when it is a module, else `a.b`."""
    files = {
        module_name(path): path
        for folder in folders
        for path in folder.rglob("*.py")
        if "migrations" not in path.parts
    }
    graph = {}
    for name, path in files.items():
        found = set()
        for imported in imported_modules(path):
            if imported in files:
                found.add(imported)
            elif imported.rpartition(".")[0] in files and imported.rpartition(".")[0] != name:
                found.add(imported.rpartition(".")[0])
        graph[name] = found - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph`: its strongly connected components of more than one module
    (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def offending(folder: str, forbidden: str) -> list[str]:
    return sorted(
        f"{path.relative_to(REPO)}: {name}"
        for path in (REPO / folder).rglob("*.py")
        for name in imported_modules(path)
        if name == forbidden or name.startswith(forbidden + ".")
    )


def test_the_web_tier_never_imports_workers():
    assert offending("platform", "workers") == []


def test_workers_never_import_the_sweep_module():
    assert offending("workers", "experiments.sweeps") == []


def test_the_checks_see_an_import_inside_a_function(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def enqueue():\n    from workers import app\n")
    assert "workers" in imported_modules(module)


def test_rollout_workers_import_evaluation_not_the_trainer():
    rollout = imported_modules(REPO / "workers" / "rollout.py") | imported_modules(
        REPO / "workers" / "jobs.py"
    )
    assert not [name for name in rollout if name.startswith("rlcore.trainer")]
    assert "rlcore.evaluate" in rollout


def test_no_import_circles():
    graph = import_graph([REPO / "rlcore", REPO / "workers", REPO / "platform"])
    assert {
        "rlcore.trainer",
        "workers.source",
        "experiments.models.runs",
        "dashboards.comparison.compare",
    } <= set(graph)
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_circle_through_type_checking(tmp_path):
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from c import X\n"
    )
    (tmp_path / "c.py").write_text("def f():\n    from a import Y\n")
    graph = {
        p.stem: {m.partition(".")[0] for m in imported_modules(p)} & {"a", "b", "c"}
        for p in tmp_path.glob("*.py")
    }
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
