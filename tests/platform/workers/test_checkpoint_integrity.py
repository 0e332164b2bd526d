"""A checkpoint altered in the shared `LAB_VAR_DIR` while its run's worker was gone is never
resumed from: its sha256, recorded in the database when it was written, no longer matches, so the
resumed attempt sets it aside and goes on from the checkpoint before it, saying so on the run,
and the run logs exactly the curves of an uninterrupted twin."""

from __future__ import annotations

import pytest
from support import queue_sweep, wait_for
from worker_helpers import TRAINING_CONFIG, assert_curves_equal, damage, wait_until_over

from experiments.models import Checkpoint, Run
from rlcore import checkpoints

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_damaged_checkpoint_is_passed_over_for_the_one_before(start_worker, team, alice):
    config = {**TRAINING_CONFIG, "steps": 60, "checkpoint_every": 4, "eval_every": 20}
    run = queue_sweep(team, alice, "damaged", config=config).runs.get()
    twin = queue_sweep(team, alice, "twin", config=config).runs.get()
    first = start_worker()
    wait_for(lambda: Checkpoint.objects.filter(run=run).count() >= 2, 240, "two checkpoints")
    first.kill()
    newest, previous = checkpoints.existing(run.checkpoint_dir)[:2]
    damage(newest[1])
    start_worker()  # its reaper re-queues the run, and it resumes it
    wait_until_over([run, twin], 300)

    run.refresh_from_db()
    assert (run.status, run.attempt) == (Run.SUCCEEDED, 2), run.error
    assert [note["text"] for note in run.notes] == [
        f"resumed from {previous[1].name}, passing over {newest[1].name} does not match the sha256 "
        "recorded when it was written (damaged or altered)"
    ]
    recorded = dict(Checkpoint.objects.filter(run=run).values_list("step", "sha256"))
    assert set(recorded) == set(range(4, 61, 4))
    # It succeeded: its checkpoints, the one set aside too, are gone (the ledger keeps their sha256).
    assert not run.checkpoint_dir.exists()
    assert_curves_equal(run, twin)
