"""A run's checkpoints are kept while a retry could resume from them, and no longer: a succeeded
run (never retried) ends with its checkpoint folder gone, a cancelled one keeps its checkpoints and
a retry resumes from them, and a deleted run's folder goes with it however it is deleted."""

from __future__ import annotations

import pytest
from django.db import transaction
from support import TINY_CONFIG, queue_sweep, wait_for, wait_for_log

from experiments import packing, series
from experiments.models import Checkpoint, Experiment, Run
from rlcore import checkpoints

pytestmark = pytest.mark.django_db(transaction=True)

# Long enough that a cancel sent after its second checkpoint lands well before its last step.
LONG = {**TINY_CONFIG, "steps": 300, "eval_every": 100, "checkpoint_every": 2}


def ended(run: Run, timeout_s: float = 300) -> Run:
    wait_for(lambda: Run.objects.get(pk=run.pk).status not in Run.ACTIVE, timeout_s, f"run {run.pk} to end")
    run.refresh_from_db()
    return run


def test_a_succeeded_runs_checkpoints_go_and_a_cancelled_runs_stay_for_its_retry(start_worker, team, alice):
    short = queue_sweep(team, alice, "succeeds").runs.get()
    cancelled = queue_sweep(team, alice, "cancelled", config=LONG).runs.get()
    worker = start_worker()

    ended(short)
    assert short.status == Run.SUCCEEDED, short.error
    assert not short.checkpoint_dir.exists() and not short.checkpoint_dir.parent.exists()
    # What the ledger recorded stays: the sha256 of each checkpoint the run wrote.
    steps = TINY_CONFIG["steps"]
    assert set(Checkpoint.objects.filter(run=short).values_list("step", flat=True)) == set(
        range(2, steps + 1, 2)
    )

    wait_for(lambda: Checkpoint.objects.filter(run=cancelled).count() >= 2, 240, "two checkpoints")
    assert cancelled.cancel()
    ended(cancelled)
    assert cancelled.status == Run.CANCELLED and cancelled.progress < LONG["steps"], cancelled.progress
    kept = checkpoints.existing(cancelled.checkpoint_dir)
    assert len(kept) == checkpoints.KEEP
    recorded = dict(Checkpoint.objects.filter(run=cancelled).values_list("step", "sha256"))
    assert all(checkpoints.file_sha256(path)[0] == recorded[step] for step, path in kept)

    assert cancelled.retry()
    ended(cancelled)
    assert (cancelled.status, cancelled.attempt) == (Run.SUCCEEDED, 2), cancelled.error
    wait_for_log(worker, f"run {cancelled.pk} attempt 2: succeeded")
    # Resumed from a kept checkpoint, not started again: step 1 keeps the point attempt 1 wrote.
    [(step_1, wall_time_1)] = [
        (step, us)
        for name, (steps_, _, times) in series.points_of(cancelled.pk, "loss")
        for step, us in zip(steps_.tolist(), times.tolist(), strict=True)
        if step == 1
    ]
    assert packing.wall_time(wall_time_1) < cancelled.started
    assert not cancelled.checkpoint_dir.parent.exists()


def test_a_deleted_runs_folder_goes_however_it_is_deleted(make_run):
    runs = [make_run(f"run {i}") for i in range(3)]
    for run in runs:
        run.checkpoint_dir.mkdir(parents=True)
        (run.checkpoint_dir / "step-000002.pt").write_bytes(b"weights")
        (run.checkpoint_dir.parent / "buffer").mkdir()
        Run.objects.filter(pk=run.pk).update(status=Run.SUCCEEDED)
    alone, in_the_admin, on_its_page = runs

    with transaction.atomic():
        Run.objects.filter(pk=alone.pk).delete()  # as the admin deletes a run
        assert alone.checkpoint_dir.exists(), "not before the deletion commits"
    assert not alone.checkpoint_dir.parent.exists()

    experiment = Experiment.objects.filter(pk=in_the_admin.experiment_id)
    with pytest.raises(RuntimeError), transaction.atomic():
        experiment.delete()
        raise RuntimeError("rolled back")
    assert in_the_admin.checkpoint_dir.exists(), "a deletion rolled back keeps the files"
    experiment.delete()  # as the admin deletes an experiment: its runs go with it
    assert not in_the_admin.checkpoint_dir.parent.exists()

    on_its_page.experiment.delete_with_files()
    assert not on_its_page.checkpoint_dir.parent.exists()
