"""A worker killed mid-run: the run is reaped as lost, re-queued, and finished by a new
worker process from its last checkpoint, with exactly one point per (name, step). A worker killed
while a cancel of its run was pending: the run ends cancelled, never re-queued."""

from __future__ import annotations

import os
import shutil
import signal

import pytest
from django.conf import settings
from support import TINY_CONFIG, last_step, queue_sweep, wait_for, wait_for_log
from worker_helpers import assert_resumed_once, reap_lost

from experiments.models import MetricChunk, MetricSummary, Run
from experiments.sweeps import create_experiment, expand
from rlcore import models
from rlcore.sinks import WARM_START

pytestmark = pytest.mark.django_db(transaction=True)

# Long enough to still be training when the worker is killed after 5 steps are written (points
# are written every half second, and a tiny step takes a few ms on a fast machine).
STEPS = 200


def test_sigkilled_worker_run_is_reaped_requeued_and_resumed(start_worker, team, alice, capsys):
    config = {**TINY_CONFIG, "steps": STEPS, "eval_every": 20}
    experiment = queue_sweep(team, alice, "survives a crash", config=config)
    run = experiment.runs.get()
    first = start_worker()
    wait_for(
        lambda: (last_step(run, "loss") or -1) >= 5,
        240,
        "5 steps on the first worker",
    )
    first.kill()
    run.refresh_from_db()
    assert run.status == Run.RUNNING and run.worker == first.identity
    assert any(run.checkpoint_dir.iterdir()), "a checkpoint was written before the kill"

    reap_lost(run, capsys, first.identity)

    second = start_worker()
    wait_for(lambda: Run.objects.get(pk=run.pk).status not in Run.ACTIVE, 240, "the second attempt to end")
    run.refresh_from_db()
    assert (run.status, run.attempt, run.worker) == (Run.SUCCEEDED, 2, second.identity), run.error
    assert_resumed_once(run, STEPS)
    wait_for_log(second, f"run {run.pk} attempt 2: succeeded")
    assert f"run {run.pk} attempt 1" not in second.log()


def test_the_worker_reaps_lost_runs_by_itself(start_worker, team, alice, worker_env):
    experiment = queue_sweep(team, alice, "orphan", presets=["reinforce"])
    run = experiment.runs.get()
    run.claim("a-worker-that-died:1", attempt=1)
    Run.objects.filter(pk=run.pk).update(heartbeat=run.heartbeat.replace(year=2000))

    worker = start_worker()
    wait_for(lambda: Run.objects.get(pk=run.pk).status == Run.SUCCEEDED, 240, "the orphaned run to be redone")
    run.refresh_from_db()
    assert run.attempt == 2 and run.worker == worker.identity
    assert f"run {run.pk} lost (worker a-worker-that-died:1 stopped sending heartbeats)" in worker.log()


# A model size no other test uses and an unreachable target: a warm start of up to 3,000 steps,
# far longer than the test needs to cancel the run and kill its worker in it.
WARM_START_CONFIG = {
    **TINY_CONFIG,
    "model": {
        "tiny": {
            **TINY_CONFIG["model"]["tiny"],
            "intermediate_size": 80,
            "warmstart_max_steps": 3000,
            "warmstart_accuracy": 0.99,
        }
    },
}


def test_a_cancel_pending_when_the_worker_dies_in_the_warm_start_is_final(start_worker, team, alice):
    sweep = expand(WARM_START_CONFIG, ["grpo"], [{}], [0])
    cached = f"tiny-{models.tiny_cache_key(sweep.configs[0])}"
    shutil.rmtree(settings.LAB_CACHE_DIR / cached, ignore_errors=True)
    experiment = create_experiment(team, alice, "cancelled while warming up", "", sweep)
    run = experiment.runs.get()
    first = start_worker()
    try:
        wait_for(lambda: Run.objects.get(pk=run.pk).phase == WARM_START, 120, "the warm start")
        # Frozen first: the warm start would hear the cancel within a second and end the run itself
        # (test_cancel_warm_start.py); here its worker dies with the cancel still pending.
        os.killpg(first.proc.pid, signal.SIGSTOP)
        assert run.cancel() and run.status == Run.RUNNING and run.cancel_requested is not None
        first.kill()

        second = start_worker()  # its reaper finds the run's heartbeat stale
        wait_for(
            lambda: Run.objects.filter(pk=run.pk).exclude(status=Run.RUNNING, attempt=1).exists(),
            60,
            "the run to be reaped",
        )
        run.refresh_from_db()
        assert (run.status, run.attempt) == (Run.CANCELLED, 1), "cancel is final: not re-queued"
        assert run.error == f"worker {first.identity} stopped sending heartbeats"
        wait_for_log(second, f"run {run.pk} lost ({run.error}); now cancelled, attempt 1")
        assert f"run {run.pk} attempt 2" not in second.log()
        assert not MetricChunk.objects.filter(run=run).exists(), "never trained"
        assert not MetricSummary.objects.filter(run=run).exists()
    finally:
        # The killed worker's half-built model (a temporary folder beside the cache entry).
        for leftover in settings.LAB_CACHE_DIR.glob(f"{cached}-*"):
            shutil.rmtree(leftover, ignore_errors=True)
