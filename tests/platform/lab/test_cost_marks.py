"""What a test costs is marked from what it starts (tests/conftest.py), so `make test-fast` leaves
out every test that starts Chromium, a Celery worker or another process: a test, a fixture or a
helper of the tests' own that starts one marks the tests that use it; one that only names a
process's type, or starts nothing, marks nothing."""

from __future__ import annotations

import os
import subprocess

import pytest
from support import REPO, WorkerProcess, queue_sweep, start_web

COSTS = {"browser", "workers", "subprocess"}


def marks(request) -> set[str]:
    return {mark.name for mark in request.node.iter_markers()} & COSTS


def conftest(request, path: str):
    (module,) = [
        plugin
        for plugin in request.config.pluginmanager.get_plugins()
        if getattr(plugin, "__file__", None) == str(REPO / path)
    ]
    return module


def start_a_child() -> int:
    return subprocess.run(["true"]).returncode


def names_types_only(worker: WorkerProcess) -> subprocess.Popen | None:
    """Annotations and a function named but not called start nothing."""
    spawn = os.system
    return None if spawn else None


@pytest.fixture
def a_child() -> int:
    return start_a_child()


def test_a_test_that_starts_a_process_is_marked_subprocess(request):
    assert subprocess.run(["true"]).returncode == 0
    assert marks(request) == {"subprocess"}


def test_a_helper_that_starts_one_marks_the_test_calling_it(request):
    assert start_a_child() == 0
    assert marks(request) == {"subprocess"}


def test_a_fixture_that_starts_one_marks_the_tests_using_it(request, a_child):
    assert a_child == 0
    assert marks(request) == {"subprocess"}


def test_a_test_that_starts_nothing_is_not_marked(request):
    assert names_types_only(None) is None
    assert marks(request) == set()


def test_the_fixtures_and_helpers_that_start_processes_are_read_as_such(request):
    code_cost = conftest(request, "tests/conftest.py").code_cost
    fixtures = conftest(request, "tests/platform/conftest.py")

    def cost(fixture) -> set[str]:
        return set(code_cost(fixture.__wrapped__))

    assert cost(fixtures.browser) == {"browser"}
    assert cost(fixtures.worker) == cost(fixtures.start_worker) == {"workers"}
    assert cost(fixtures.redis_server) == {"subprocess"}
    assert cost(fixtures.page) == cost(fixtures.worker_env) == cost(fixtures.make_run) == set()
    assert set(code_cost(start_web)) == {"subprocess"}
    assert set(code_cost(queue_sweep)) == set(code_cost(names_types_only)) == set()
