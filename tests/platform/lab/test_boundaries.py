"""Who may import whom (docs/architecture.md, "Boundaries"): the apps of `platform/` import only
from the floors below their own, in the order that section states; the web tier under `platform/`
never imports `workers/` (it sends tasks by name, `execution.messages`), the worker never imports
the sweep module (it re-validates a run's config through `Run.run_config`), rollout workers never
import the trainer, and no module of `rlcore/`, `workers/` or `platform/` is part of an import
circle (every import counts: at module level, inside functions, under `TYPE_CHECKING`)."""

from __future__ import annotations

import ast
import re
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


def stated_floors(architecture: str) -> list[list[str]]:
    """The floors of the apps, top to bottom, as the first block of the "Boundaries" section of
    docs/architecture.md states them: on each line, the names before its description (which is set
    off by two spaces or more); a name is an app (`dashboards`) or a module of one (`lab.celery`)."""
    section = architecture.split("\n## Boundaries\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```\n", 2)[1]
    return [
        [name.strip() for name in re.split(r"\s{2,}", line.strip())[0].split(",")]
        for line in block.splitlines()
        if line.strip()
    ]


def floor_of(module: str, floors: list[list[str]]) -> int | None:
    """The floor (0 the top) of `module`: that of the longest stated name it is or lies under. An
    app's own package counts as the app's lowest floor (importing any of its modules runs it)."""
    stated = {name: i for i, floor in enumerate(floors) for name in floor}
    if "." not in module:
        return max((i for name, i in stated.items() if name.partition(".")[0] == module), default=None)
    under = [name for name in stated if module == name or module.startswith(name + ".")]
    return stated[max(under, key=len)] if under else None


def upward_imports(root: Path, floors: list[list[str]]) -> list[str]:
    """Each import, in a module of the apps under `root` (migrations included), of a module on a
    floor above its own, or of another app on its own floor (`from a.b import c` imports `a.b.c`
    when that is a module, else `a.b`)."""
    apps = {path.parent.name for path in root.glob("*/__init__.py")}
    files = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[0] in apps:
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    found = []
    for name, path in files.items():
        floor = floor_of(name, floors)
        imported = {
            module if module in files or module.rpartition(".")[0] not in files else module.rpartition(".")[0]
            for module in imported_modules(path)
            if module.partition(".")[0] in apps
        }
        for module in sorted(imported):
            below = floor_of(module, floors)
            if below < floor or (below == floor and module.partition(".")[0] != name.partition(".")[0]):
                found.append(f"{path.relative_to(root)} (floor {floor}) imports {module} (floor {below})")
    return sorted(found)


def test_every_app_stands_on_a_stated_floor():
    floors = stated_floors((REPO / "docs" / "architecture.md").read_text())
    names = [name for floor in floors for name in floor]
    apps = {path.parent.name for path in (REPO / "platform").glob("*/__init__.py")}
    assert {name.partition(".")[0] for name in names} == apps
    missing = [
        name
        for name in names
        if not (REPO / "platform" / name.replace(".", "/")).with_suffix(".py").exists()
        and not (REPO / "platform" / name.replace(".", "/") / "__init__.py").exists()
    ]
    assert missing == []


def test_no_app_imports_from_a_floor_above_its_own():
    floors = stated_floors((REPO / "docs" / "architecture.md").read_text())
    assert upward_imports(REPO / "platform", floors) == []


def test_the_floor_check_finds_an_import_from_above_and_one_across(tmp_path):
    for app in ("roof", "mid", "side", "ground"):
        (tmp_path / app).mkdir()
        (tmp_path / app / "__init__.py").write_text("")
    (tmp_path / "roof" / "urls.py").write_text("from mid import views\nfrom ground.wiring import x\n")
    (tmp_path / "roof" / "wiring.py").write_text("")
    (tmp_path / "mid" / "views.py").write_text("import ground\ndef f():\n    from roof.urls import y\n")
    (tmp_path / "side" / "models.py").write_text("from mid.views import z\n")
    (tmp_path / "ground" / "wiring.py").write_text("from roof.urls import w\n")
    floors = [["roof"], ["mid", "side"], ["ground", "roof.wiring"]]
    assert floor_of("roof", floors) == 2 and floor_of("roof.urls", floors) == 0
    assert floor_of("roof.wiring.thing", floors) == 2
    assert upward_imports(tmp_path, floors) == [
        "ground/wiring.py (floor 2) imports roof.urls (floor 0)",
        "mid/views.py (floor 1) imports roof.urls (floor 0)",
        "side/models.py (floor 1) imports mid.views (floor 1)",
    ]
    stated = stated_floors("# A\n\n## Boundaries\n\nProse.\n\n```\nroof   top\nmid, side   m\nground\n```\n")
    assert stated == [["roof"], ["mid", "side"], ["ground"]]


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
