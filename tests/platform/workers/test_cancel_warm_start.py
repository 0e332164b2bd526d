"""A cancel reaches a run still preparing its model: the tiny model's warm start asks for a stop
request about once a second, so a run cancelled in a warm start of 20,000 steps ends `cancelled`
by its own worker within seconds, never trained, and the half-built model's temporary folder is
gone."""

from __future__ import annotations

import shutil

import pytest
from django.conf import settings
from support import TINY_CONFIG, wait_for, wait_for_log
from worker_helpers import jsonl_config, write_dataset

from experiments.models import MetricChunk, Run
from experiments.sweeps import create_experiment, expand
from rlcore import models
from rlcore.sinks import WARM_START

pytestmark = pytest.mark.django_db(transaction=True)

# An unreachable target: the warm start would run all 20,000 steps (minutes to hours).
ENDLESS = {**TINY_CONFIG["model"]["tiny"], "warmstart_max_steps": 20_000, "warmstart_accuracy": 0.99}
# Far more than the second or so a cancel takes on an idle machine: the test waits for the run to
# end, and only fails when that takes this long (beside CPU-bound processes too).
ENDS_WITHIN_S = 90


def test_a_cancel_in_the_warm_start_ends_the_run_and_removes_the_half_built_model(start_worker, team, alice):
    data = write_dataset("cancelled-warm-start.jsonl")
    sweep = expand(jsonl_config(data, model={"tiny": ENDLESS}), ["grpo"], [{}], [0])
    building = f"tiny-{models.tiny_cache_key(sweep.configs[0])}"
    shutil.rmtree(settings.LAB_CACHE_DIR / building, ignore_errors=True)
    run = create_experiment(team, alice, "cancelled while warming up", "", sweep).runs.get()
    worker = start_worker()
    wait_for(lambda: Run.objects.get(pk=run.pk).phase == WARM_START, 120, "the warm start")
    assert list(settings.LAB_CACHE_DIR.glob(f"{building}-*")), (
        "the model is being built in a temporary folder"
    )

    assert run.cancel() and run.status == Run.RUNNING
    wait_for(
        lambda: Run.objects.get(pk=run.pk).status not in Run.ACTIVE,
        ENDS_WITHIN_S,
        "the cancel to end the run",
    )
    run.refresh_from_db()
    assert (run.status, run.attempt, run.worker, run.error) == (Run.CANCELLED, 1, worker.identity, "")
    assert run.phase == WARM_START and run.phase_detail["step"] < ENDLESS["warmstart_max_steps"]
    # Its own worker ended it (the task's result line, logged after the end is committed).
    wait_for_log(worker, f"run {run.pk} attempt 1: cancelled")
    assert not MetricChunk.objects.filter(run=run).exists(), "never trained"
    assert run.provenance == {} and run.summary["completed"] == 0
    assert [p.name for p in settings.LAB_CACHE_DIR.glob(f"{building}*")] == [f"{building}.lock"], (
        "no half-built model left"
    )
