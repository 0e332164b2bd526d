"""A run's memory ceiling (`LAB_RUN_MEMORY_MB`): a run that outgrows it ends `failed` with the
reason at its first attempt and is never re-queued; its worker lives on and runs the next one.

The worker test uses a real worker process with a ceiling below what a larger built-in model
needs to warm-start (≈ 34 M parameters: weights, gradients and AdamW moments ≈ 0.5 GB) and
above what the small test model needs; the rollout test gives a rollout worker a ceiling that its
first job's loader threads fit in and a batch of 4,096 responses does not. The in-process tests
call `MemoryCeiling` directly from pytest's main thread, the way a worker's solo pool does.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys

import pytest
from django.core.management import call_command
from support import REPO, TINY_CONFIG, queue_sweep, wait_for

from execution.models import Worker
from experiments.models import RolloutJob, Run
from workers import memory
from workers.memory import MemoryCeiling, OverMemoryCeiling

CEILING_MB = 300
LARGER_MODEL = {
    **TINY_CONFIG,
    "model": {
        "tiny": {
            "hidden_size": 512,
            "num_layers": 8,
            "num_heads": 8,
            "intermediate_size": 2048,
            "warmstart_max_steps": 50,
        }
    },
}


@pytest.mark.django_db(transaction=True)
def test_a_run_over_the_ceiling_fails_once_and_the_worker_runs_the_next(start_worker, team, alice):
    big = queue_sweep(team, alice, "too big", config=LARGER_MODEL).runs.get()
    small = queue_sweep(team, alice, "fits").runs.get()
    # The ceiling holds in each trainer rank too: rank 0 outgrows it warm-starting θ0.
    ranks = queue_sweep(
        team, alice, "too big in ranks", config={**LARGER_MODEL, "execution": {"train_processes": 2}}
    ).runs.get()
    worker = start_worker({"LAB_RUN_MEMORY_MB": str(CEILING_MB)})

    ids = [big.pk, small.pk, ranks.pk]
    wait_for(
        lambda: not Run.objects.filter(pk__in=ids, status__in=Run.ACTIVE).exists(),
        300,
        "the three runs to end",
    )
    big.refresh_from_db()
    small.refresh_from_db()
    ranks.refresh_from_db()
    assert (ranks.status, ranks.attempt) == (Run.FAILED, 1), ranks.error
    assert "trainer rank 0 failed: OverMemoryCeiling: memory: " in ranks.error, ranks.error
    assert f"ceiling {CEILING_MB} MiB (LAB_RUN_MEMORY_MB)" in ranks.error, ranks.error
    assert (small.status, small.attempt, small.worker) == (Run.SUCCEEDED, 1, worker.identity), small.error
    assert (big.status, big.attempt, big.worker) == (Run.FAILED, 1, worker.identity)
    assert (
        big.error.startswith("memory: ") and f"ceiling {CEILING_MB} MiB (LAB_RUN_MEMORY_MB)" in big.error
    ), big.error
    # Never re-queued: not by the worker's own reaper (it reaps again after this), nor by hand.
    wait_for(
        lambda: Worker.objects.get(identity=worker.identity).last_seen > small.finished,
        30,
        "the worker's reaper to run again",
    )
    call_command("reap")
    big.refresh_from_db()
    assert (big.status, big.attempt) == (Run.FAILED, 1)
    log = worker.log()
    assert f"run {big.pk} attempt 1: failed" in log and f"run {big.pk} attempt 2" not in log
    assert f"run {big.pk} lost" not in log and worker.proc.poll() is None
    # A retry by hand is allowed (e.g. after raising the ceiling) and counts against LAB_MAX_ATTEMPTS.
    assert big.retry_refusal() == ""


ROLLOUT_CEILING_MB = 150
# A model whose weights transformers loads with a pool of threads (the operator's probe, F4), and a
# batch of 256 × 16 responses whose first tokens alone outgrow a rollout worker's ceiling.
LARGER_ROLLOUT_MODEL = {
    **TINY_CONFIG,
    "model": {
        "tiny": {
            "hidden_size": 256,
            "num_layers": 4,
            "num_heads": 4,
            "intermediate_size": 1024,
            "warmstart_max_steps": 50,
        }
    },
    "steps": 2,
    "eval_every": 2,
    "execution": {"mode": "distributed"},
}
LARGE_BATCH = {
    **LARGER_ROLLOUT_MODEL,
    "rollout": {"group_size": 16, "prompts_per_step": 256, "max_new_tokens": 256},
    # The trainer's own evaluation of θ0 before step 1 generates up to 256 tokens a prompt too:
    # two prompts, not twenty, so that the run gets to its batch (and its failing job) in seconds.
    "eval_size": 2,
}


@pytest.mark.django_db(transaction=True)
def test_a_rollout_job_over_the_ceiling_fails_at_its_first_attempt_and_one_within_it_does_not(
    start_worker, team, alice
):
    fits = queue_sweep(team, alice, "fits", config=LARGER_ROLLOUT_MODEL).runs.get()
    too_big = queue_sweep(team, alice, "large batches", config=LARGE_BATCH).runs.get()
    start_worker({"LAB_RUN_MEMORY_MB": "0"})
    rollout = start_worker({"LAB_RUN_MEMORY_MB": str(ROLLOUT_CEILING_MB)}, queue="rollout")

    ids = [fits.pk, too_big.pk]
    wait_for(
        lambda: not Run.objects.filter(pk__in=ids, status__in=Run.ACTIVE).exists(), 900, "both runs to end"
    )
    fits.refresh_from_db()
    too_big.refresh_from_db()
    # The first job under the ceiling loads the weights with the loader's threads: they start (the
    # address-space limit leaves room for their stacks and arenas), and no job of the run that fits
    # needs a second attempt.
    assert fits.status == Run.SUCCEEDED, fits.error
    jobs = RolloutJob.objects.filter(run=fits)
    assert jobs.filter(kind=RolloutJob.BATCH).count() == 2
    assert set(jobs.values_list("status", "attempt", "worker")) == {(RolloutJob.DONE, 1, rollout.identity)}
    # Whatever runs out under the ceiling (the watchdog's count, an allocation, the address space
    # for a thread), it is the memory reason, at the first attempt, and never tried again.
    assert too_big.status == Run.FAILED and "memory: " in too_big.error, too_big.error
    job = RolloutJob.objects.get(run=too_big, kind=RolloutJob.BATCH, step=1)
    assert (job.status, job.attempt, job.worker) == (RolloutJob.FAILED, 1, rollout.identity), job.error
    assert job.error.startswith("memory: ") and f"{ROLLOUT_CEILING_MB} MiB (LAB_RUN_MEMORY_MB" in job.error, (
        job.error
    )
    log = rollout.log()
    assert "can't start new thread" not in log and f"rollout job {job.pk} attempt 2" not in log
    assert rollout.proc.poll() is None


def grow(step_mb: int, steps: int) -> int:
    """Allocate `steps` × `step_mb` MiB, swallowing every ordinary exception on the way."""
    kept = []
    for _ in range(steps):
        # What a trainer's broad handler would do: the ceiling still holds.
        with contextlib.suppress(Exception):
            kept.append(bytearray(step_mb * 2**20))
    return len(kept)


def test_a_call_that_outgrows_the_ceiling_is_interrupted_and_reported():
    ceiling = MemoryCeiling(64)
    with pytest.raises(OverMemoryCeiling) as err:
        ceiling.call(grow, 8, 200)  # 1.6 GB if nothing stopped it
    assert str(err.value).startswith("memory: used ") and "> ceiling 64 MiB (LAB_RUN_MEMORY_MB)" in str(
        err.value
    )
    used = int(str(err.value).split()[2].replace(",", ""))
    assert 64 < used < 64 + 200 * 8


def test_a_call_within_the_ceiling_returns_and_leaves_the_process_as_it_was():
    handler = signal.getsignal(memory.SIGNAL)
    limit = resource.getrlimit(resource.RLIMIT_AS)
    assert MemoryCeiling(256, limit_address_space=True).call(grow, 8, 4) == 4
    assert signal.getsignal(memory.SIGNAL) == handler
    assert resource.getrlimit(resource.RLIMIT_AS) == limit


def test_one_allocation_larger_than_the_ceiling_fails_at_once_on_cpu():
    import torch

    limit = resource.getrlimit(resource.RLIMIT_AS)
    with pytest.raises(OverMemoryCeiling) as err:
        MemoryCeiling(64, limit_address_space=True).call(torch.ones, 2**30 // 4)  # 1 GiB in one call
    assert str(err.value).startswith("memory: an allocation failed under the ceiling of 64 MiB")
    assert "can't allocate memory" in str(err.value)
    assert resource.getrlimit(resource.RLIMIT_AS) == limit


def test_no_ceiling_when_it_is_zero():
    assert MemoryCeiling(0).enforced == "LAB_RUN_MEMORY_MB is 0"
    assert MemoryCeiling(0).call(grow, 8, 2) == 2


def run_memory_setting(value: str | None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "LAB_RUN_MEMORY_MB"}
    if value is not None:
        environ["LAB_RUN_MEMORY_MB"] = value
    code = "from django.conf import settings; print(settings.LAB_RUN_MEMORY_MB)"
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**environ, "PYTHONPATH": str(REPO / "platform")},
        capture_output=True,
        text=True,
    )


def test_the_default_ceiling_is_an_equal_share_of_the_machine_among_the_workers_make_up_starts():
    from lab.settings import UP_WORKER_QUEUES, default_run_memory_mb, machine_memory_mb

    assert default_run_memory_mb(16_000, 2) == 8_000
    done = run_memory_setting(None)
    assert int(done.stdout) == default_run_memory_mb(machine_memory_mb(), len(UP_WORKER_QUEUES)) > 0
    assert run_memory_setting("0").stdout.strip() == "0"


@pytest.mark.parametrize(("value", "words"), [("lots", "a whole number of MiB"), ("-1", "0 (off) or more")])
def test_a_bad_ceiling_setting_stops_start_up_naming_it(value, words):
    done = run_memory_setting(value)
    assert done.returncode != 0 and "LAB_RUN_MEMORY_MB must be" in done.stderr and words in done.stderr
