"""A run of `execution.train_processes: 2` on a real training worker: the worker starts torchrun
ranks (`workers.ranks`) and never joins them itself; the curves are a one-process run's; a cancel
ends every rank, and so does the worker's own death."""

from __future__ import annotations

import psutil
import pytest
from support import TINY_CONFIG, last_step, queue_sweep, wait_for
from worker_helpers import assert_curves_equal, wait_until_over

from execution.models import Worker
from experiments.models import Run
from rlcore.launch import usable_cores
from workers.ranks import run_folder

pytestmark = pytest.mark.django_db(transaction=True)

RANKS = {**TINY_CONFIG, "execution": {"train_processes": 2}}
LONG = {**RANKS, "steps": 400, "eval_every": 400, "checkpoint_every": 50}


def rank_processes(run: Run) -> list[psutil.Process]:
    """torchrun and the ranks of `run`'s current attempt (their command lines name its folder)."""
    folder = str(run_folder(run))
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "workers.ranks" in cmdline and folder in cmdline:
            found.append(proc)
    return found


def gone(procs: list[psutil.Process]) -> bool:
    return not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in procs)


def started_ranks(run: Run) -> list[psutil.Process]:
    wait_for(lambda: (last_step(run, "loss") or 0) >= 2, 60, "two steps trained by the ranks")
    procs = rank_processes(run)
    assert len(procs) >= 3, procs  # torchrun and its two ranks
    return procs


def test_two_ranks_on_a_worker_train_the_one_process_curves(start_worker, team, alice):
    one = queue_sweep(team, alice, "one process", config=TINY_CONFIG).runs.get()
    two = queue_sweep(team, alice, "two processes", config=RANKS).runs.get()
    worker = start_worker()
    wait_until_over([one, two], 120)
    for run in (one, two):
        run.refresh_from_db()
        assert run.status == Run.SUCCEEDED, run.error
    assert_curves_equal(two, one)
    assert two.summary["steps"] == TINY_CONFIG["steps"]
    # The ranks ran outside the worker's process, their output kept with the run's files.
    assert list((run_folder(two) / "logs").rglob("*.log"))
    assert "trainer ranks" in worker.log()
    record = Worker.objects.get(identity=worker.identity)
    assert (record.cores, record.gpus) == (usable_cores(), 0)


def test_a_cancel_ends_every_rank(start_worker, team, alice):
    run = queue_sweep(team, alice, "cancelled", config=LONG).runs.get()
    start_worker()
    procs = started_ranks(run)
    run.cancel()
    wait_for(lambda: gone(procs), 10, "every rank to end after the cancel")
    wait_until_over([run], 30)
    run.refresh_from_db()
    assert run.status == Run.CANCELLED, run.error


def test_a_killed_worker_takes_its_ranks_with_it(start_worker, team, alice):
    run = queue_sweep(team, alice, "orphaned", config=LONG).runs.get()
    worker = start_worker()
    procs = started_ranks(run)
    worker.kill()
    wait_for(lambda: gone(procs), 10, "every rank to end with the worker")


def test_a_rank_that_dies_fails_the_attempt_naming_it(start_worker, team, alice):
    run = queue_sweep(team, alice, "a rank dies", config=LONG).runs.get()
    start_worker()
    procs = started_ranks(run)
    [rank_one] = [p for p in procs if p.environ().get("RANK") == "1"]
    rank_one.kill()
    wait_until_over([run], 30)
    run.refresh_from_db()
    assert run.status == Run.FAILED
    assert "trainer rank 1 " in run.error, run.error
    wait_for(lambda: gone(procs), 10, "every rank to end after one died")
    assert run.summary.get("steps", 0) >= 2  # what it logged before it failed
