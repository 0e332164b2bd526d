"""A dataset file edited between attempts is never trained on: the experiment pinned the sha256 of
what its runs read, so the attempt that finds other bytes fails before it loads anything, naming
the file and both hashes, and logs nothing; with the file restored the run resumes from its
checkpoint, and every attempt's provenance stays on the run. A rollout worker refuses such a run's
jobs the same way."""

from __future__ import annotations

import pytest
from support import last_step, queue_sweep, wait_for
from worker_helpers import jsonl_config, write_dataset

from experiments import packing, series
from experiments.models import Checkpoint, Run
from rlcore.tasks import file_sha256
from workers.jobs import CannotMake
from workers.rollout import producer_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_resume_on_an_edited_dataset_is_refused_and_goes_on_once_it_is_restored(start_worker, team, alice):
    data = write_dataset("edited.jsonl")
    read = file_sha256(data)
    config = jsonl_config(data, steps=300, checkpoint_every=2, eval_every=100)
    experiment = queue_sweep(team, alice, "edited between attempts", config=config)
    run = experiment.runs.get()
    first = start_worker()
    wait_for(lambda: Checkpoint.objects.filter(run=run).exists(), 240, "a checkpoint")
    first.kill()
    run.refresh_from_db()
    assert run.status == Run.RUNNING and run.provenance["dataset_sha256"] == read
    trained = last_step(run, "loss")

    write_dataset("edited.jsonl", answer_of=lambda a: 0)  # the same lines, every answer rewritten
    edited = file_sha256(data)
    second = start_worker()  # its reaper re-queues the run as attempt 2, which it then executes
    wait_for(
        lambda: Run.objects.filter(pk=run.pk, attempt=2).exclude(status__in=Run.ACTIVE).exists(),
        120,
        "attempt 2 to end",
    )
    run.refresh_from_db()
    assert (run.status, run.attempt) == (Run.FAILED, 2)
    assert run.error == (
        "DatasetMismatch: dataset data/edited.jsonl has changed since this experiment's runs read it: "
        f"they read sha256 {read}, this worker found {edited}. One experiment never mixes dataset "
        "versions: restore the file to go on, or start a new sweep to train on it as it is now"
    )
    assert last_step(run, "loss") == trained, "nothing trained on the edited lines"
    assert run.provenance_history == [{"attempt": 1, "provenance": run.provenance}]
    experiment.refresh_from_db()
    assert experiment.dataset_hashes == {str(data): read}

    write_dataset("edited.jsonl")
    assert file_sha256(data) == read
    assert run.retry()
    wait_for(lambda: Run.objects.get(pk=run.pk).status not in Run.ACTIVE, 240, "attempt 3 to end")
    run.refresh_from_db()
    assert (run.status, run.attempt, run.worker) == (Run.SUCCEEDED, 3, second.identity), run.error
    assert [entry["attempt"] for entry in run.provenance_history] == [1, 3]
    assert {entry["provenance"]["dataset_sha256"] for entry in run.provenance_history} == {read}
    assert run.provenance == run.provenance_history[-1]["provenance"]
    # Resumed from attempt 1's checkpoint, not restarted: step 1 keeps the point attempt 1 wrote.
    ((steps, _, times),) = [points for name, points in series.points_of(run.pk, "loss")]
    assert steps.tolist() == list(range(1, 301))
    assert packing.wall_time(times[0]) < run.started


def test_a_rollout_worker_makes_no_job_of_a_run_whose_dataset_changed(team, alice):
    data = write_dataset("edited-while-distributed.jsonl")
    read = file_sha256(data)
    run = queue_sweep(team, alice, "rollouts", config=jsonl_config(data)).runs.get()
    run.experiment.pin("a" * 64, {str(data): read})  # as the run's trainer did when it started
    write_dataset("edited-while-distributed.jsonl", answer_of=lambda a: 0)
    with pytest.raises(CannotMake, match=f"they read sha256 {read}, this worker found {file_sha256(data)}"):
        producer_for(run)
