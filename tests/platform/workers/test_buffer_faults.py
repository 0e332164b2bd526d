"""A run's buffer damaged under it (what the probe did to a shared `LAB_VAR_DIR`) costs no result:
batch files damaged or deleted before the trainer takes them are made again; a weights file a
queued job needs, damaged after the trainer moved past that version, re-queues the run, which
resumes from an earlier checkpoint and publishes the version again. Either way the run logs the
simulated twin's curves exactly. And a rollout job over the run's memory ceiling fails at once
with the reason, its worker living on."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from django.db.models import Max
from support import TINY_CONFIG, queue_sweep, wait_for
from worker_helpers import TRAINING_CONFIG, assert_curves_equal, damage, wait_until_over

from experiments.models import PolicyVersion, RolloutJob, Run
from rlcore.staleness import steps_by_version
from workers.buffer import weight_store

pytestmark = pytest.mark.django_db(transaction=True)

CONFIG = {**TRAINING_CONFIG, "steps": 40, "checkpoint_every": 4, "eval_every": 20}
STALENESS = [{"sync_offset": 4}]  # batches made up to 4 steps ahead of the trainer


class Paused:
    """SIGSTOP a worker's whole process group meanwhile (well under the heartbeat timeout); or
    `hold` and `release` it where the pauses of two workers overlap."""

    def __init__(self, worker):
        self.pgid = worker.proc.pid

    def hold(self) -> None:
        os.killpg(self.pgid, signal.SIGSTOP)

    def release(self) -> None:
        os.killpg(self.pgid, signal.SIGCONT)

    def __enter__(self):
        self.hold()

    def __exit__(self, *exc):
        self.release()


def twin_and_run(team, alice):
    twin = queue_sweep(team, alice, "twin", config=CONFIG, staleness=STALENESS).runs.get()
    distributed = {**CONFIG, "execution": {"mode": "distributed"}}
    run = queue_sweep(team, alice, "damaged", config=distributed, staleness=STALENESS).runs.get()
    return twin, run


# The trainer records version v (publishing it, with the batch jobs of later steps) before it
# takes step v + 1's batch: with v its newest version it has taken no batch past step v + 1, as
# long as v + 1 is a version it records (batches of later steps are made with it).
RECORDED = {
    v
    for v, steps in steps_by_version(CONFIG["steps"], 1, STALENESS[0]["sync_offset"], False).items()
    if max(steps) > v
}
# Each worker below is held (SIGSTOP) while the other works, for as long as that takes on a loaded
# machine: far under this heartbeat timeout, so that no reaper takes the held one's run or jobs.
PATIENT = {"LAB_HEARTBEAT_TIMEOUT_S": "300"}


def test_batch_files_damaged_or_deleted_before_they_are_taken_are_made_again(start_worker, team, alice):
    rollout_worker = start_worker(PATIENT, queue="rollout")
    trainer = start_worker(PATIENT)
    # However fast the trainer runs (all 40 steps can take it a second), the batches spoiled are
    # made while it cannot take them: the rollout worker is held until the trainer waits for its
    # first batch, then the trainer is held while the rollout worker makes what there is to make.
    held_trainer = Paused(trainer)
    with Paused(rollout_worker):
        twin, run = twin_and_run(team, alice)
        versions = PolicyVersion.objects.filter(run=run)
        wait_for(versions.exists, 240, "the trainer to publish θ0 and wait for its first batch")
        held_trainer.hold()
    try:
        newest = versions.aggregate(v=Max("version"))["v"]
        assert newest + 1 in RECORDED, f"the trainer got too far (version {newest}) to know what it took"
        untaken = RolloutJob.objects.filter(run=run, kind=RolloutJob.BATCH, step__gt=newest + 1)
        ahead = wait_for(
            lambda: (
                len(jobs := list(untaken.order_by("step"))) >= 2
                and all(job.status == RolloutJob.DONE for job in jobs)
                and jobs
            ),
            120,
            "the rollout worker to make the batches the trainer has not taken",
        )
        for i, job in enumerate(ahead):
            path = Path(job.path)
            if i % 2:
                path.unlink()
            else:
                damage(path)
    finally:
        held_trainer.release()
    wait_until_over([run, twin], 300)

    run.refresh_from_db()
    assert (run.status, run.attempt) == (Run.SUCCEEDED, 1), run.error
    remade = RolloutJob.objects.filter(pk__in=[job.pk for job in ahead])
    assert {(job.status, job.attempt) for job in remade} == {(RolloutJob.DONE, 2)}, (
        "each made again, once, when the trainer took it"
    )
    assert trainer.log().count("its batch file cannot be used") == len(ahead)
    assert_curves_equal(run, twin)


def test_weights_damaged_after_the_trainer_moved_past_them_are_published_again(start_worker, team, alice):
    rollout_worker = start_worker(queue="rollout")
    trainer = start_worker()
    twin, run = twin_and_run(team, alice)
    versions = PolicyVersion.objects.filter(run=run)
    wait_for(versions.filter(version__gte=10).exists, 240, "version 10")
    held_rollouts = Paused(rollout_worker)
    with Paused(trainer):  # its logged metrics lag it by many steps: where it is, read while held
        newest = versions.aggregate(v=Max("version"))["v"]
        assert newest + 1 in RECORDED, f"the trainer got too far (version {newest}): no batch is left to make"
        held_rollouts.hold()
    try:
        # The trainer runs out of batches made ahead and waits for the oldest queued job.
        waited_on = wait_for(
            lambda: (
                RolloutJob.objects.filter(run=run, kind=RolloutJob.BATCH, status=RolloutJob.QUEUED)
                .order_by("step")
                .first()
            ),
            30,
            "a queued batch job",
        )
        # Older than the trainer's newest checkpoint by the time it waits for this job (it trains
        # at most to that job's step, 5 steps past its version): that checkpoint cannot be resumed.
        version = waited_on.version
        damage(weight_store(run).path(version))
    finally:
        held_rollouts.release()
    wait_until_over([run, twin], 300)

    run.refresh_from_db()
    assert (run.status, run.attempt) == (Run.SUCCEEDED, 2), run.error
    notes = [note["text"] for note in run.notes]
    assert len(notes) == 1 and notes[0].startswith("resumed from step-"), notes
    assert f"weights of version {version} at runs/" in notes[0] and "do not match their sha256" in notes[0]
    waited_on.refresh_from_db()
    assert waited_on.status == RolloutJob.DONE and waited_on.attempt >= 2
    assert_curves_equal(run, twin)


LARGER_MODEL = {
    "tiny": {
        "hidden_size": 512,
        "num_layers": 8,
        "num_heads": 8,
        "intermediate_size": 2048,
        "warmstart_max_steps": 0,  # θ0 as initialised: built in a moment, 34 M parameters
    }
}
CEILING_MB = 150


def test_a_rollout_job_over_the_memory_ceiling_fails_once_and_its_worker_goes_on(start_worker, team, alice):
    rollout_worker = start_worker({"LAB_RUN_MEMORY_MB": str(CEILING_MB)}, queue="rollout")
    start_worker({"LAB_RUN_MEMORY_MB": "0"})
    execution = {"execution": {"mode": "distributed"}, "steps": 2, "eval_every": 0, "checkpoint_every": 0}
    big = {**TINY_CONFIG, **execution, "model": LARGER_MODEL}
    too_big = queue_sweep(team, alice, "too big", config=big).runs.get()
    wait_until_over([too_big], 300)
    fits = queue_sweep(team, alice, "fits", config={**TINY_CONFIG, **execution}).runs.get()
    wait_until_over([fits], 300)

    too_big.refresh_from_db()
    fits.refresh_from_db()
    job = RolloutJob.objects.get(run=too_big, step=1)
    assert (job.status, job.attempt) == (RolloutJob.FAILED, 1), (
        f"not retried: it would fail alike ({job.error!r})"
    )
    assert job.error.startswith("memory: ") and f"{CEILING_MB} MiB (LAB_RUN_MEMORY_MB" in job.error, job.error
    assert too_big.status == Run.FAILED and job.error in too_big.error
    assert fits.status == Run.SUCCEEDED, fits.error
    assert rollout_worker.proc.poll() is None
