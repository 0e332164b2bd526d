"""No test module imports another: what tests share lives in a conftest.py (fixtures) or in a
helper module that is not a test module (`support.py`, `sample_experiments.py`, a folder's
`*_helpers.py`), so running or moving one test module never depends on another. Every Python
file under tests/ is read, imports inside functions included."""

from __future__ import annotations

import ast

from support import REPO

TESTS = REPO / "tests"


def test_module_imports(source: str, filename: str = "<source>") -> list[str]:
    """The imports of a test module (`test_*`) or of a conftest in `source`, as written."""
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")  # `tests.rlcore.test_trainer` as much as `test_trainer`
            if any(part.startswith("test_") or part == "conftest" for part in parts):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return sorted(found, key=lambda line: int(line.split(":")[0].split()[1]))


test_module_imports.__test__ = False  # a helper, not a test


def test_no_file_under_tests_imports_a_test_module_or_a_conftest():
    files = sorted(TESTS.rglob("*.py"))
    assert len(files) > 50, "tests/ was found"
    offenders = {
        str(path.relative_to(REPO)): found
        for path in files
        if (found := test_module_imports(path.read_text(), str(path)))
    }
    assert offenders == {}, "move what they share to a conftest.py or a helper module"


def test_the_check_sees_every_way_of_importing_one():
    source = """
import test_compare
import os, test_speedup as speedup
from test_compare_browser import rendered
from conftest import demo

def inside():
    from test_reports import MALICIOUS

from tests.rlcore.test_trainer import TIMING
from tests.rlcore.conftest import SMALL
from tests.rlcore.rlcore_helpers import merge

import dashboard_helpers
from support import wait_for
from django.test import utils
"""
    assert [line.split(": ", 1)[1] for line in test_module_imports(source)] == [
        "import test_compare",
        "import os, test_speedup as speedup",
        "from test_compare_browser import rendered",
        "from conftest import demo",
        "from test_reports import MALICIOUS",
        "from tests.rlcore.test_trainer import TIMING",
        "from tests.rlcore.conftest import SMALL",
    ]
