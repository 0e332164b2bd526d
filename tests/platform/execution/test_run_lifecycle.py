"""`Run` state transitions: each is one conditional UPDATE, so a run is claimed once, a late
or duplicate message does nothing, and the reaper re-queues lost runs up to the attempt limit."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone
from support import TINY_CONFIG, logged, queue_sweep

from experiments.models import Completion, Run
from rlcore.sinks import Sample
from workers.sink import DatabaseSink
from workers.tasks import execute

pytestmark = pytest.mark.django_db


def test_a_run_is_claimed_once(run):
    assert run.claim("w1:1", attempt=1)
    assert not Run.objects.get(pk=run.pk).claim("w2:2", attempt=1)
    run.refresh_from_db()
    assert (run.status, run.worker) == (Run.RUNNING, "w1:1")


def test_late_and_duplicate_messages_do_nothing(run):
    run.claim("w1:1", attempt=1)
    assert execute(run.pk, 1).endswith("not queued any more, nothing to do")
    run.finish("w1:1", {"reward/mean": 0.5})
    assert execute(run.pk, 1).endswith("nothing to do")
    assert execute(run.pk + 1000, 1).endswith("nothing to do")
    run.refresh_from_db()
    # finish adds the collapse flag (no eval points logged here: not collapsed).
    assert (run.status, run.worker, run.summary) == (
        Run.SUCCEEDED,
        "w1:1",
        {"reward/mean": 0.5, "collapsed": 0.0},
    )


def test_a_message_for_an_old_attempt_never_executes_an_attempt_twice(run, team, alice):
    run.claim("w1:1", attempt=1)
    run.fail("w1:1", "RuntimeError: boom")
    run.retry()
    # The run is queued again (attempt 2): any message of its queue may start it, once.
    assert run.claim("w2:2", attempt=2)
    assert execute(run.pk, 1).endswith("nothing to do")
    assert execute(run.pk, 2).endswith("nothing to do")
    run.refresh_from_db()
    assert (run.status, run.attempt, run.worker) == (Run.RUNNING, 2, "w2:2")


def test_runs_are_claimed_first_in_first_out_across_experiments(team, alice):
    first = queue_sweep(team, alice, "first", presets=["grpo", "reinforce"])
    later = queue_sweep(team, alice, "later")
    gpu = queue_sweep(team, alice, "gpu", config={**TINY_CONFIG, "device": "cuda"})
    # Whatever order the broker delivers the messages in, the oldest queued run of the queue goes first.
    order = [Run.claim_next("cpu", f"w{i}:1") for i in range(4)]
    assert [r.pk if r else None for r in order] == [
        *first.runs.values_list("pk", flat=True),
        later.runs.get().pk,
        None,
    ]
    assert Run.claim_next("gpu", "g:1") == gpu.runs.get(), "queues are separate"


def test_a_worker_that_lost_its_run_cannot_finish_it(run):
    run.claim("w1:1", attempt=1)
    Run.objects.filter(pk=run.pk).update(heartbeat=timezone.now() - timedelta(hours=1))
    Run.reap()
    run.refresh_from_db()
    assert run.stop_requested("w1:1") and not run.beat("w1:1", 3)
    assert not run.finish("w1:1", {}) and not run.fail("w1:1", "late")
    assert (run.status, run.attempt) == (Run.QUEUED, 2)


@override_settings(LAB_MAX_ATTEMPTS=2)
def test_the_reaper_gives_up_after_max_attempts(run):
    for attempt in (1, 2):
        run.claim(f"w{attempt}:1", attempt=attempt)
        Run.objects.filter(pk=run.pk).update(heartbeat=timezone.now() - timedelta(hours=1))
        assert [r.pk for r in Run.reap()] == [run.pk]
        run.refresh_from_db()
    assert (run.status, run.attempt) == (Run.LOST, 2)
    assert "stopped sending heartbeats" in run.error


@pytest.mark.django_db(transaction=True)
def test_a_reaped_run_with_attempts_left_is_never_seen_lost(run, monkeypatch):
    """Marked lost and queued again in one transaction: committed one after the other, a page or
    a caller waiting for the run to end would see it lost (over) for a moment."""
    from django.db import transaction

    seen = []
    real_mark_lost = Run.mark_lost

    def mark_then_look(self, stale_before):
        done = real_mark_lost(self, stale_before)
        transaction.on_commit(lambda: seen.append(Run.objects.get(pk=self.pk).status))
        return done

    monkeypatch.setattr(Run, "mark_lost", mark_then_look)
    run.claim("w1:1", attempt=1)
    Run.objects.filter(pk=run.pk).update(heartbeat=timezone.now() - timedelta(hours=1))
    assert [r.pk for r in Run.reap()] == [run.pk]
    assert seen == [Run.QUEUED], "the lost attempt was visible before its run was queued again"


def test_a_fresh_heartbeat_is_not_reaped(run):
    run.claim("w1:1", attempt=1)
    assert Run.reap() == []
    run.refresh_from_db()
    assert run.status == Run.RUNNING


def test_cancel_of_a_running_run_is_a_request_the_worker_honours(run):
    run.claim("w1:1", attempt=1)
    assert run.cancel() and run.status == Run.RUNNING and run.stop_requested("w1:1")
    assert run.finish("w1:1", {"steps": 3.0})
    assert run.status == Run.CANCELLED
    assert not run.cancel()


@pytest.mark.django_db(transaction=True)
def test_the_sink_upserts_points_and_drops_them_once_the_run_is_not_its_own(run):
    run.claim("w1:1", attempt=1)
    sink = DatabaseSink(run, "w1:1")
    sink.log(1, {"loss": 0.5, "grad_norm": float("nan")})
    sink.sample(1, [Sample("12+34=", "46", 1.0)])
    sink.flush()
    sink.log(1, {"loss": 0.25})
    sink.sample(1, [Sample("12+34=", "47", 0.0)])
    sink.close()
    assert sorted(logged(run)) == [
        ("grad_norm", 1, None),
        ("loss", 1, 0.25),
    ]
    assert list(Completion.objects.filter(run=run).values_list("completion", flat=True)) == ["47"]

    stranger = DatabaseSink(run, "w2:2")
    stranger.log(2, {"loss": 0.125})
    stranger.close()
    assert [point for point in logged(run) if point[1] == 2] == []
    assert stranger.should_stop() and not sink.should_stop()


def test_a_cancel_pending_when_the_worker_died_ends_the_run_cancelled_not_requeued(run):
    run.claim("w1:1", attempt=1)
    assert run.cancel()
    Run.objects.filter(pk=run.pk).update(heartbeat=timezone.now() - timedelta(hours=1))
    Run.reap()
    run.refresh_from_db()
    assert (run.status, run.attempt) == (Run.CANCELLED, 1), "cancel is final"


@override_settings(LAB_MAX_ATTEMPTS=2)
def test_manual_retries_count_against_the_attempt_cap(run):
    run.claim("w1:1", attempt=1)
    run.fail("w1:1", "RuntimeError: boom")
    assert run.retry() and run.attempt == 2
    run.claim("w2:2", attempt=2)
    run.fail("w2:2", "RuntimeError: boom again")
    assert "used all 2 attempts" in run.retry_refusal()
    assert not run.retry()
    run.refresh_from_db()
    assert (run.status, run.attempt) == (Run.FAILED, 2)
