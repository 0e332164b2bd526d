"""Who may import whom (DESIGN.md, "Boundaries"): the web tier under `platform/` never imports
`workers/` (it sends tasks by name through the app in `lab.celery`), and the worker never imports
the sweep module (it re-validates a run's config through `Run.run_config`)."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO


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
