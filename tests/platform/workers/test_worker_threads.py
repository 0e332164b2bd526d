"""Workers never oversubscribe the CPU: each trains with `LAB_TORCH_THREADS` torch threads, by
default an equal share of the machine's cores among the workers `make up` starts (at least
one), set before it takes any work and reported in its start-up line."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from support import REPO

from lab.settings import default_torch_threads, usable_cores

READY_THREADS = re.compile(r"worker \S+ ready on \S+ .*, torch threads (\d+) \(inter-op (\d+)\)")


@pytest.mark.parametrize(
    ("cores", "workers", "threads"),
    [(16, 1, 16), (16, 2, 8), (2, 2, 1), (3, 2, 1), (7, 3, 2), (1, 2, 1), (2, 3, 1)],
)
def test_each_worker_gets_an_equal_share_of_the_cores_and_at_least_one(cores, workers, threads):
    assert default_torch_threads(cores, workers) == threads


def settings_in_a_fresh_process(**env: str) -> tuple[int, int]:
    """(LAB_TORCH_THREADS, number of workers `make up` starts) as the settings read them."""
    environ = {k: v for k, v in os.environ.items() if k != "LAB_TORCH_THREADS"}
    code = (
        "from django.conf import settings; print(settings.LAB_TORCH_THREADS, len(settings.UP_WORKER_QUEUES))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**environ, "PYTHONPATH": str(REPO / "platform"), **env},
        capture_output=True,
        text=True,
        check=True,
    )
    threads, workers = done.stdout.split()
    return int(threads), int(workers)


def test_by_default_the_workers_make_up_starts_share_the_cores():
    threads, workers = settings_in_a_fresh_process()
    assert threads == default_torch_threads(usable_cores(), workers)


def test_lab_torch_threads_overrides_the_default():
    assert settings_in_a_fresh_process(LAB_TORCH_THREADS="3")[0] == 3


@pytest.mark.django_db(transaction=True)  # without it the worker's DATABASE_URL is not the test database's
def test_a_worker_trains_with_lab_torch_threads_and_says_so(start_worker):
    # OpenMP and MKL told 3: only the worker's own setting can bring torch down to 1 thread.
    worker = start_worker({"LAB_TORCH_THREADS": "1", "OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "3"})
    assert READY_THREADS.search(worker.log()).groups() == ("1", "1"), worker.log()
