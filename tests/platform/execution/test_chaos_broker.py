"""Broker chaos: Redis is SIGKILLed (it keeps nothing on disk, so every message goes with it) while
one run trains and others are queued; during the outage a sweep is submitted, a run retried and
a lost run re-queued by the reaper; Redis comes back empty on the same port. Every run must end
`succeeded`, each executed exactly once (one claim per run in the worker's log, the attempts
expected) with every metric point once.

The test starts its own redis-server on a free loopback port and a real worker against it and
the test database, and stops both whatever happens. It prints one line of figures (runs, lost,
duplicated) for docs/operations.md's reliability section (`pytest -s`, or the `broker_chaos` property).
"""

from __future__ import annotations

import copy
import re
from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone
from support import TINY_CONFIG, logged, queue_sweep, use_broker, wait_for

from accounts.models import ApiToken
from experiments.models import Run
from rlcore.sinks import STEP_METRICS

pytestmark = pytest.mark.django_db(transaction=True)

# The run that trains while Redis dies: long enough to be seen training (its progress is written
# every half second, and a tiny step takes a few ms on a fast machine) and still be training then.
TRAINING_STEPS = 200
STEPS = TINY_CONFIG["steps"]
END_TIMEOUT_S = 300


def test_a_broker_killed_and_restarted_loses_and_duplicates_nothing(
    redis_server, start_worker, team, alice, client, record_property
):
    api = {"HTTP_AUTHORIZATION": f"Bearer {ApiToken.issue(alice)}", "content_type": "application/json"}
    with use_broker(redis_server.url):
        worker = start_worker({"REDIS_URL": redis_server.url})
        first = queue_sweep(
            team, alice, "before the outage", config={**TINY_CONFIG, "steps": TRAINING_STEPS}, seeds=[0, 1, 2]
        )
        training, waiting, cancelled = first.runs.order_by("id")
        assert cancelled.cancel()
        wait_for(
            lambda: Run.objects.filter(pk=training.pk, status=Run.RUNNING, progress__gte=1).exists(),
            END_TIMEOUT_S,
            "the first run to train",
        )
        assert Run.objects.get(pk=waiting.pk).status == Run.QUEUED
        # A run whose worker is about to die (the real worker is busy): its heartbeats stop during the outage.
        orphan = queue_sweep(team, alice, "orphan").runs.get()
        assert orphan.claim("a-worker-that-dies:1", attempt=1)

        redis_server.kill()
        body = {"name": "during the outage", "team": "team-a", "config": copy.deepcopy(TINY_CONFIG)}
        submitted = client.post("/api/sweeps", {**body, "presets": ["grpo"], "seeds": [0, 1]}, **api)
        assert submitted.status_code == 201, submitted.content
        assert "broker cannot be reached" in submitted.json()["message"]
        retried = client.post(f"/api/runs/{cancelled.pk}/retry", **api)
        assert retried.status_code == 200, retried.content
        assert retried.json()["dispatched_at"] is None
        Run.objects.filter(pk=orphan.pk).update(heartbeat=timezone.now() - timedelta(hours=1))
        wait_for(
            lambda: Run.objects.filter(
                pk=orphan.pk, status=Run.QUEUED, attempt=2, dispatched_at=None
            ).exists(),
            60,
            "the worker's reaper to re-queue the orphan while the broker is down",
        )
        wait_for(
            lambda: Run.objects.get(pk=training.pk).status != Run.RUNNING,
            END_TIMEOUT_S,
            "the training run to end while the broker is down",
        )
        wait_for(
            lambda: worker.log().count("dispatching queued work failed") >= 3,
            60,
            "the worker's dispatcher to keep trying while the broker is down",
        )

        redis_server.start()  # the same port, no messages
        runs = Run.objects.filter(
            pk__in=[*first.runs.values_list("pk", flat=True), orphan.pk, *submitted.json()["runs"]]
        )
        wait_for(lambda: not runs.filter(status__in=Run.ACTIVE).exists(), END_TIMEOUT_S, "every run to end")

    log = worker.log()
    claims = Counter(int(n) for n in re.findall(r"run (\d+) attempt \d+: claimed by", log))
    attempts = {run.pk: run.attempt for run in runs}
    expected = {run.pk: 2 if run.pk in (cancelled.pk, orphan.pk) else 1 for run in runs}
    points = Counter(
        (run.pk, name, step) for run in runs for name, step, _ in logged(run) if name in STEP_METRICS
    )
    duplicated = sum(n - 1 for n in claims.values() if n > 1) + sum(n - 1 for n in points.values() if n > 1)
    steps_of = {run.pk: run.steps for run in runs}
    have = Counter(pk for pk, _, _ in points.elements())
    lost = sum(run.status != Run.SUCCEEDED for run in runs) + sum(
        max(0, steps_of[pk] * len(STEP_METRICS) - have[pk]) for pk in steps_of
    )
    figures = (
        f"broker chaos: {len(runs)} runs (1 training and 1 queued when Redis was killed, 1 re-queued by the "
        f"reaper, 1 retried and 2 submitted during the outage), {lost} lost, {duplicated} duplicated"
    )
    print(figures)
    record_property("broker_chaos", figures)

    assert {run.pk: run.status for run in runs} == {pk: Run.SUCCEEDED for pk in steps_of}, {
        run.pk: run.error for run in runs
    }
    assert attempts == expected
    assert claims == {pk: 1 for pk in steps_of}, "each run claimed once by the worker"
    assert (lost, duplicated) == (0, 0)
    assert "re-sent the message of Run" in log, "the dispatcher sent what the outage lost"
