"""A run of `execution.train_processes: 2` on a real training worker: the worker starts torchrun
ranks (`workers.ranks`) and never joins them itself; the curves are a one-process run's, also
when a rank is SIGKILLed mid-run (the attempt fails naming it, the run resumes from its sharded
checkpoint); a cancel ends every rank, so does the worker's own death, and a rank that hangs in a
collective is ended by the timeout."""

from __future__ import annotations

import time

import psutil
import pytest
from support import TINY_CONFIG, last_step, queue_sweep, wait_for
from worker_helpers import (
    RANKS_REL,
    TRAINING_CONFIG,
    assert_curves_equal,
    assert_resumed_once,
    wait_until_over,
)

from execution.models import Worker
from experiments.models import Run
from rlcore import checkpoints
from rlcore.launch import usable_cores
from workers.ranks import run_folder

pytestmark = pytest.mark.django_db(transaction=True)

RANKS_OF = {"execution": {"train_processes": 2}}
RANKS = {**TINY_CONFIG, **RANKS_OF}
LONG = {**RANKS, "steps": 400, "eval_every": 400, "checkpoint_every": 50}
# Long enough that rank 1 is killed well before the end; every other step a checkpoint step; a
# run that learns, so that its curves equal to the one-process run's say something.
KILLED = {**TRAINING_CONFIG, "steps": 12, "eval_every": 4, "checkpoint_every": 2}
HANG_TIMEOUT_S = 15  # LAB_RANK_TIMEOUT_S of the hang's worker: well over any wait of a healthy rank


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


def the_ranks(run: Run) -> dict[str, psutil.Process]:
    """Rank 0 and rank 1 of `run`'s current attempt, once both run."""

    def found():
        ranks = {}
        for proc in rank_processes(run):
            try:
                rank = proc.environ().get("RANK")
            except psutil.NoSuchProcess:
                continue
            if rank is not None:
                ranks[rank] = proc
        return ranks if set(ranks) == {"0", "1"} else None

    return wait_for(found, 120, f"both ranks of run {run.pk}")


def kill_rank_one_after_a_checkpoint(run: Run, steps: int) -> int:
    """SIGKILL rank 1 of `run` once a checkpoint is on disk, with both ranks held (SIGSTOP) while
    that is looked at, so the kill lands before the last step whatever the load; the newest
    checkpoint's step then."""
    ranks = the_ranks(run)
    deadline = time.monotonic() + 120
    while True:
        for proc in ranks.values():
            proc.suspend()
        written = [step for step, _ in checkpoints.existing_sharded(run.checkpoint_dir)]
        if written or time.monotonic() > deadline:
            break
        for proc in ranks.values():
            proc.resume()
        time.sleep(0.05)
    assert written, "no checkpoint within 120 s"
    assert max(written) < steps and not (run_folder(run) / "result.json").exists(), written
    ranks["1"].kill()
    ranks["0"].resume()
    return max(written)


def test_two_ranks_on_a_worker_train_the_one_process_curves_even_after_a_rank_is_killed(
    start_worker, team, alice
):
    """Rank 1 SIGKILLed after the first checkpoint: the attempt fails naming it and the run is
    re-queued like a lost worker's; attempt 2 resumes from the sharded checkpoint and ends on
    the one-process run's curve, every point once."""
    one = queue_sweep(team, alice, "one process", config=KILLED).runs.get()
    two = queue_sweep(team, alice, "two processes", config={**KILLED, **RANKS_OF}).runs.get()
    worker = start_worker()
    kill_rank_one_after_a_checkpoint(two, KILLED["steps"])
    wait_until_over([one, two], 180)
    for run in (one, two):
        run.refresh_from_db()
        assert run.status == Run.SUCCEEDED, run.error
    assert two.attempt == 2
    # Attempt 1 failed naming the rank (its error, cleared when attempt 2 was claimed, in the log).
    assert f"run {two.pk} attempt 1 failed" in worker.log()
    assert "RankKilled: trainer rank 1 was killed by signal 9" in worker.log()
    assert f"run {two.pk} attempt 1: failed; re-queued as attempt 2" in worker.log()
    assert_resumed_once(two, KILLED["steps"])
    assert_curves_equal(two, one, rel=RANKS_REL)
    assert two.summary["steps"] == KILLED["steps"]
    # The ranks ran outside the worker's process, their output kept with the run's files.
    assert list((run_folder(two) / "logs").rglob("*.log"))
    assert "trainer ranks" in worker.log()
    record = Worker.objects.get(identity=worker.identity)
    assert (record.cores, record.gpus) == (usable_cores(), 0)
    # Its measurement counts both ranks' threads and CPU as the trainer's (rank 1's are not the
    # machine's other load), each rank with its share of the worker's threads.
    one_threads = one.measured.threads_trainer
    assert two.measured.threads_trainer == 2 * max(1, one_threads // 2), (one_threads, two.summary)
    assert two.measured.cpu_trainer_steady_s > 0


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


def test_a_rank_that_hangs_in_a_collective_is_ended_by_the_timeout(start_worker, team, alice):
    """Rank 1 stopped (SIGSTOP) mid-run: rank 0's next collective gives up after
    LAB_RANK_TIMEOUT_S, the attempt fails naming the timeout, and no rank is left running."""
    run = queue_sweep(team, alice, "a rank hangs", config=LONG).runs.get()
    start_worker(env={"LAB_RANK_TIMEOUT_S": str(HANG_TIMEOUT_S)})
    procs = started_ranks(run)
    [rank_one] = [p for p in procs if p.environ().get("RANK") == "1"]
    rank_one.suspend()
    wait_until_over([run], HANG_TIMEOUT_S + 60)
    run.refresh_from_db()
    assert run.status == Run.FAILED and run.attempt == 1, run.error
    assert (
        f"trainer rank 0 gave up waiting for the other ranks after LAB_RANK_TIMEOUT_S ({HANG_TIMEOUT_S} s)"
        in run.error
    )
    assert "Timed out" in run.error, run.error
    wait_for(lambda: gone(procs), 10, "every rank, the stopped one too, to end")
