"""Where alerts come from: a run's end (succeeded, failed, lost; collapsed from its logged
held-out accuracy), its sweep's end, and a claim's verdict changing; each stored once the
transition commits, only for the teams whose targets want it, never failing the run's own path."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from sample_experiments import accuracy, make_finished_experiment
from support import log_points

from alerts import emit
from alerts.deliver import deliver_due
from alerts.models import (
    CLAIM_VERDICT,
    EVENTS,
    RUN_COLLAPSED,
    RUN_FAILED,
    RUN_LOST,
    RUN_SUCCEEDED,
    SWEEP_FINISHED,
    Event,
    Target,
)
from dashboards.claims import service
from dashboards.claims.schemas import ClaimIn
from dashboards.models import Claim
from experiments.models import MetricChunk, MetricSummary, Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def everything(team) -> Target:
    """An email target of the team that wants every event."""
    return Target.objects.create(team=team, kind=Target.EMAIL, email="lab@example.org", events=list(EVENTS))


def events(kind: str | None = None) -> list[Event]:
    found = Event.objects.order_by("created")
    return list(found.filter(kind=kind) if kind else found)


def test_a_run_that_succeeds_alerts_once_its_transition_commits(
    run, everything, django_capture_on_commit_callbacks
):
    run.claim("w:1", attempt=1)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        assert run.finish("w:1", {"eval/accuracy": 0.5})
        assert not events(), "nothing before the commit"
    assert len(callbacks) == 1
    (succeeded,) = events(RUN_SUCCEEDED)
    assert succeeded.key == f"run {run.pk} attempt 1 succeeded"
    assert succeeded.payload["final_accuracy"] == 0.5 and succeeded.payload["url"] == f"/runs/{run.pk}/"
    assert f"run {run.pk} (grpo" in succeeded.text and succeeded.text.endswith("succeeded")
    (finished,) = events(SWEEP_FINISHED)
    assert finished.payload["by_status"] == {"succeeded": 1} and "1 succeeded" in finished.text
    assert not events(RUN_COLLAPSED)
    assert [d.target for d in succeeded.deliveries.all()] == [everything]


def test_links_are_absolute_with_the_base_url(run, everything, settings, django_capture_on_commit_callbacks):
    settings.LAB_BASE_URL = "https://lab.example.org/"
    run.claim("w:1", attempt=1)
    with django_capture_on_commit_callbacks(execute=True):
        run.fail("w:1", "RuntimeError: boom")
    assert events(RUN_FAILED)[0].payload["url"] == f"https://lab.example.org/runs/{run.pk}/"
    assert (
        events(SWEEP_FINISHED)[0].payload["url"]
        == f"https://lab.example.org/experiments/{run.experiment_id}/"
    )


def test_a_transition_rolled_back_alerts_nothing(run, everything, django_capture_on_commit_callbacks):
    run.claim("w:1", attempt=1)
    with django_capture_on_commit_callbacks(execute=True), pytest.raises(RuntimeError), transaction.atomic():
        assert run.fail("w:1", "RuntimeError: boom")
        raise RuntimeError("rolled back")
    assert not events()


def test_a_failed_run_that_collapsed_alerts_both(run, everything, django_capture_on_commit_callbacks):
    now = timezone.now()
    log_points(
        run,
        [("eval/accuracy", step, value, now) for step, value in ((0, 0.5), (10, 0.6), (20, 0.0), (30, 0.01))],
    )
    run.claim("w:1", attempt=1)
    with django_capture_on_commit_callbacks(execute=True):
        run.fail("w:1", "RuntimeError: loss is NaN")
    (failed,) = events(RUN_FAILED)
    assert failed.payload["error"] == "RuntimeError: loss is NaN" and "loss is NaN" in failed.text
    (collapsed,) = events(RUN_COLLAPSED)
    assert collapsed.payload["collapsed_step"] == 20 and "collapsed at step 20" in collapsed.text


def test_a_lost_run_alerts_with_the_attempt_it_was_queued_again_as(
    run, everything, django_capture_on_commit_callbacks
):
    run.claim("w:1", attempt=1)
    Run.objects.filter(pk=run.pk).update(heartbeat=timezone.now() - timedelta(hours=1))
    with django_capture_on_commit_callbacks(execute=True):
        (reaped,) = Run.reap()
    assert reaped.status == Run.QUEUED
    (lost,) = events(RUN_LOST)
    assert lost.key == f"run {run.pk} attempt 1 lost" and lost.payload["requeued_as_attempt"] == 2
    assert "stopped sending heartbeats" in lost.text and "re-queued as attempt 2" in lost.text
    assert not events(SWEEP_FINISHED), "its run is queued again"


@pytest.mark.django_db(transaction=True)
def test_a_run_whose_rank_was_killed_is_never_seen_failed_before_it_is_queued_again(
    run, everything, monkeypatch
):
    """The worker ends the attempt and queues the next in one transaction (`workers.tasks`).
    Committed one after the other (the bug this catches), the end's commit would show a failed
    run with nothing of its sweep queued: a "sweep finished" alert, a "failed" one without
    "re-queued", and a waiting script or page would take the run for over."""
    from workers import tasks
    from workers.ranks import RankKilled

    seen = []
    real_fail = Run.fail

    def fail_then_look(self, *args, **kwargs):
        done = real_fail(self, *args, **kwargs)
        transaction.on_commit(lambda: seen.append(Run.objects.get(pk=self.pk).status))
        return done

    monkeypatch.setattr(Run, "fail", fail_then_look)
    run.claim("w:1", attempt=1)
    killed = RankKilled("trainer rank 1 was killed by signal 9 (torchrun exited with 1)")
    said = tasks._failed(run, "w:1", killed, f"RankKilled: {killed}", None)
    assert said == f"run {run.pk} attempt 1: failed; re-queued as attempt 2"
    run.refresh_from_db()
    assert (run.status, run.attempt) == (Run.QUEUED, 2)
    assert seen == [Run.QUEUED], "the failed attempt was visible before its run was queued again"
    (failed,) = events(RUN_FAILED)
    assert failed.payload["requeued_as_attempt"] == 2 and "re-queued as attempt 2" in failed.text
    assert not events(SWEEP_FINISHED), "its run is queued again"


def test_a_sweep_finishes_with_its_last_run_and_alerts_once(
    make_experiment, everything, django_capture_on_commit_callbacks
):
    experiment = make_experiment(seeds=[0, 1])
    first, second = experiment.runs.order_by("id")
    for run in (first, second):
        run.claim(f"w:{run.pk}", attempt=1)
    with django_capture_on_commit_callbacks(execute=True):
        first.finish(f"w:{first.pk}", {})
    assert not events(SWEEP_FINISHED)
    with django_capture_on_commit_callbacks(execute=True):
        second.fail(f"w:{second.pk}", "RuntimeError: boom")
        emit._sweep_ended(experiment)  # a second worker noticing the same end
    (finished,) = events(SWEEP_FINISHED)
    assert finished.payload["by_status"] == {"succeeded": 1, "failed": 1} and finished.payload["runs"] == 2


def test_only_the_events_a_target_wants_are_stored(run, team, django_capture_on_commit_callbacks):
    Target.objects.create(team=team, kind=Target.EMAIL, email="x@example.org", events=[RUN_FAILED])
    run.claim("w:1", attempt=1)
    with django_capture_on_commit_callbacks(execute=True):
        run.finish("w:1", {})
    assert not events(), "no target wants run.succeeded or sweep.finished"


def test_an_alert_that_fails_never_fails_the_run(
    run, everything, monkeypatch, caplog, django_capture_on_commit_callbacks
):
    def broken(*args, **kwargs):
        raise RuntimeError("the alerts table is gone")

    monkeypatch.setattr(emit, "emit", broken)
    run.claim("w:1", attempt=1)
    with caplog.at_level(logging.ERROR), django_capture_on_commit_callbacks(execute=True):
        assert run.finish("w:1", {})
    run.refresh_from_db()
    assert run.status == Run.SUCCEEDED
    assert f"alerts: run {run.pk} ending succeeded failed; no alert for it" in caplog.text


def test_a_claims_verdict_changing_alerts_the_team(
    team, alice, everything, django_capture_on_commit_callbacks, settings
):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    experiment = make_finished_experiment(
        team, alice, presets=("grpo",), staleness=({}, {"sync_offset": 2}), seeds=(0, 1, 2)
    )
    # The runs at sync_offset=2 are still running and have logged nothing yet.
    waiting = list(experiment.runs.filter(staleness="sync_offset=2").order_by("id"))
    MetricChunk.objects.filter(run__in=waiting).delete()
    MetricSummary.objects.filter(run__in=waiting).delete()
    Run.objects.filter(pk__in=[r.pk for r in waiting]).update(status=Run.RUNNING, worker="w:1", finished=None)
    body = ClaimIn(
        experiment=experiment.pk, parts=[{"kind": "holds", "x": "grpo"}], settings=["sync_offset=2"]
    )
    with django_capture_on_commit_callbacks(execute=True):
        stated = service.submit(alice, body)
    assert stated["verdict"] == "cannot tell yet"
    for run in waiting:
        # 0.1 below on-policy, where the claim allows 0.02.
        on_policy = accuracy(20, 20, 0, 0, run.seed)  # its seed's on-policy run's last value
        log_points(run, [("eval/accuracy", 20, on_policy - 0.1, timezone.now())])
        run.refresh_from_db()
        with django_capture_on_commit_callbacks(execute=True):
            run.finish("w:1", {})
        deliver_due()  # the workers' alert thread checks the claim, off the run's path
    (changed,) = events(CLAIM_VERDICT)
    assert (changed.payload["before"], changed.payload["verdict"]) == ("cannot tell yet", "contradict")
    assert (
        changed.payload["url"] == f"/claims/{stated['id']}/"
        and "cannot tell yet → contradict" in changed.text
    )
    assert service.result(Claim.objects.get())["verdict"] == "contradict"
    assert changed.deliveries.get().status == "delivered"
    deliver_due()
    assert len(events(CLAIM_VERDICT)) == 1, "the same verdict again is no change"
