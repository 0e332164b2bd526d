"""What a test costs, marked from what it starts, so `make test-fast` can leave the slow ones out
(`pytest -m "not browser and not workers and not subprocess"`; `make test` runs everything):

- `browser`: it drives headless Chromium (Playwright; the `browser` and `page` fixtures);
- `workers`: it starts real Celery worker processes, which import torch (`support.WorkerProcess`:
  the `worker` and `start_worker` fixtures, or the class itself; `SlurmWorker` of test_slurm.py,
  a worker that a Slurm job starts);
- `subprocess`: it starts any other process (a Python child, `manage.py`, the web server,
  redis-server).

The marks are read from the code, not declared by hand: `pytest_collection_modifyitems` walks the
test function and each fixture it uses, and whatever of the tests' own code they call (helpers of
`support.py`, of their module, of another test module), looking for what starts a process. So a
new test that starts one is marked without anyone remembering to.
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest

TESTS = Path(__file__).resolve().parent

COSTS = ("browser", "workers", "subprocess")

# What starts a process, by the module it comes from or by the tests' own class that wraps it.
BROWSER_MODULES = ("playwright",)
# rlcore.launch starts torchrun and its trainer ranks.
PROCESS_MODULES = ("subprocess", "multiprocessing", "pty", "concurrent.futures.process", "rlcore.launch")
PROCESS_OS_CALLS = {"fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp"}
PROCESS_OS_PREFIXES = ("exec", "spawn")
WORKER_CLASSES = {("support", "WorkerProcess"), ("test_slurm", "SlurmWorker")}


def _from(module_name: str, prefixes: tuple[str, ...]) -> bool:
    return any(module_name == p or module_name.startswith(p + ".") for p in prefixes)


def _module_cost(dotted: str) -> set[str]:
    """The cost of calling what `dotted` names, by the module it comes from."""
    if _from(dotted, BROWSER_MODULES):
        return {"browser"}
    if _from(dotted, PROCESS_MODULES):
        return {"subprocess"}
    return set()


def _ours(obj: object) -> bool:
    """Whether `obj` is a function or class of the tests' own code (under tests/)."""
    if not (inspect.isfunction(obj) or inspect.isclass(obj)):
        return False
    try:
        source = inspect.getsourcefile(obj)
    except TypeError:
        return False
    return source is not None and Path(source).resolve().is_relative_to(TESTS)


def _chain(node: ast.AST) -> list[str] | None:
    """`a.b.c` as ["a", "b", "c"], or None when it does not start with a name."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(names)]
    return None


def _imported(dotted: str) -> object:
    """The object `import`/`from … import` bound to `dotted`, if its module is loaded."""
    if dotted in sys.modules:
        return sys.modules[dotted]
    module, _, name = dotted.rpartition(".")
    return getattr(sys.modules.get(module), name, None)


class _Reader(ast.NodeVisitor):
    """Reads one function or class: the costs of what it calls, and the tests' own functions and
    classes it names (read in turn). Annotations are left out: naming a type starts nothing."""

    def __init__(self, namespace: dict):
        self.namespace = namespace
        self.local: dict[str, str] = {}  # a name imported inside the code → its dotted name
        self.costs: set[str] = set()
        self.ours: list[object] = []

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            bound = alias.asname or alias.name.partition(".")[0]
            self.local[bound] = alias.name if alias.asname else bound

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            self.local[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def visit_arg(self, node: ast.arg) -> None:
        pass

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for child in (*node.decorator_list, *node.args.defaults, *node.args.kw_defaults, *node.body):
            if child is not None:
                self.visit(child)

    visit_AsyncFunctionDef = visit_FunctionDef

    def _named(self, chain: list[str]) -> tuple[object, str]:
        """What `chain` names: the object (None when unknown) and the dotted name it comes from."""
        if chain[0] in self.local:
            value, dotted = _imported(self.local[chain[0]]), [self.local[chain[0]]]
        else:
            value = self.namespace.get(chain[0])
            dotted = [value.__name__] if isinstance(value, ModuleType) else []
        for attr in chain[1:]:
            if not isinstance(value, ModuleType):
                break
            value = getattr(value, attr, None)
            dotted.append(attr)
        if not isinstance(value, ModuleType) and value is not None:
            dotted = [getattr(value, "__module__", None) or "", getattr(value, "__name__", "")]
        return value, ".".join(dotted)

    def _reference(self, node: ast.Name | ast.Attribute) -> None:
        chain = _chain(node)
        if chain is None:
            self.generic_visit(node)
            return
        value, _ = self._named(chain)
        if _ours(value) and (value.__module__, value.__name__) not in WORKER_CLASSES:
            self.ours.append(value)

    def visit_Name(self, node: ast.Name) -> None:
        self._reference(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._reference(node)

    def visit_Call(self, node: ast.Call) -> None:
        chain = _chain(node.func)
        if chain is not None:
            value, dotted = self._named(chain)
            if (getattr(value, "__module__", None), getattr(value, "__name__", None)) in WORKER_CLASSES:
                self.costs.add("workers")
            elif chain[0] == "os" and len(chain) == 2:
                if chain[1] in PROCESS_OS_CALLS or chain[1].startswith(PROCESS_OS_PREFIXES):
                    self.costs.add("subprocess")
            else:
                self.costs |= _module_cost(dotted)
        self.generic_visit(node)


def _namespace(obj: object) -> dict:
    """The globals `obj`'s code runs with: a function's own (conftest modules share the name
    `conftest`, so `sys.modules` cannot tell them apart), a class's through its methods."""
    if inspect.isfunction(obj):
        return obj.__globals__
    for member in vars(obj).values():
        if inspect.isfunction(member):
            return member.__globals__
    return vars(sys.modules[obj.__module__])


def _source(obj: object) -> str:
    """`obj`'s source. A class is looked for in the files of its own methods (not those a dataclass
    generates), else, for a class of a conftest module, in every conftest.py under tests/:
    conftest modules share the name `conftest`, so `inspect.getsource` may look in another one."""
    if inspect.isclass(obj):
        files = [
            Path(member.__code__.co_filename) for member in vars(obj).values() if inspect.isfunction(member)
        ]
        if obj.__module__ == "conftest":
            files += sorted(TESTS.rglob("conftest.py"))
        for path in files:
            if not path.is_file():
                continue
            text = path.read_text()
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.ClassDef) and node.name == obj.__qualname__.rsplit(".", 1)[-1]:
                    return ast.get_source_segment(text, node, padded=True) or ""
    return inspect.getsource(obj)


@cache
def code_cost(obj: object) -> frozenset[str]:
    """What calling `obj` (a function or class of the tests' own code) starts: read from its
    source and, in turn, from the tests' own code it names (not from what it only annotates)."""
    seen: set[object] = set()
    found: set[str] = set()
    todo = [obj]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        reader = _Reader(_namespace(current))
        for node in ast.parse(textwrap.dedent(_source(current))).body:
            for part in node.body if isinstance(node, ast.ClassDef) else [node]:
                reader.visit(part)
        found |= reader.costs
        todo += reader.ours
    return frozenset(found)


def costs_of(item: pytest.Item) -> set[str]:
    """The marks `item` earns from its own code and from each fixture it uses."""
    functions = [getattr(item, "function", None)]
    fixtureinfo = getattr(item, "_fixtureinfo", None)
    if fixtureinfo is not None:
        functions += [d.func for defs in fixtureinfo.name2fixturedefs.values() for d in defs]
    found: set[str] = set()
    for function in functions:
        if function is not None and _ours(inspect.unwrap(function)):
            found |= code_cost(inspect.unwrap(function))
    return found


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        found = costs_of(item)
        for cost in COSTS:
            if cost in found:
                item.add_marker(getattr(pytest.mark, cost))
