"""Requests that race each other keep the rules: concurrent retries stay within
`LAB_TEAM_MAX_QUEUED` (checked under the team's row lock, as sweeps are), a member removed while
their sweep is being queued queues nothing once the removal has answered, and a retry racing the
delete of its experiment answers 404 or 409, never 500."""

from __future__ import annotations

import threading

import pytest
from django.db import connections
from django.test import Client
from support import TINY_CONFIG, queue_sweep

from accounts.models import ApiToken, Membership
from experiments.models import Experiment, Run
from experiments.sweeps import SweepError, create_experiment, expand

pytestmark = pytest.mark.django_db(transaction=True)

GPU = {**TINY_CONFIG, "device": "cuda"}  # no worker listens on the gpu queue: queued runs stay queued


def together(calls) -> list:
    """Run `calls` in threads released at once; their results (or exceptions) in order."""
    barrier = threading.Barrier(len(calls))
    results: list = [None] * len(calls)

    def run(i, call):
        try:
            barrier.wait()
            results[i] = call()
        except Exception as exc:  # noqa: BLE001 - returned to the test
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def cancelled_runs(team, alice, n: int) -> list[Run]:
    experiment = queue_sweep(team, alice, "cancelled", config=GPU, seeds=list(range(n)))
    experiment.cancel()
    return list(experiment.runs.all())


def test_concurrent_retries_stay_within_the_queued_cap(team, alice, settings):
    settings.LAB_TEAM_MAX_QUEUED = 30
    to_retry = cancelled_runs(team, alice, 20)
    queue_sweep(team, alice, "queued", config=GPU, seeds=list(range(29)))
    token = ApiToken.issue(alice)

    def retry(run):
        return Client().post(f"/api/runs/{run.pk}/retry", HTTP_AUTHORIZATION=f"Bearer {token}").status_code

    statuses = together([lambda run=run: retry(run) for run in to_retry])
    assert sorted(statuses) == [200] + [409] * 19, statuses
    assert Run.objects.filter(experiment__team=team, status=Run.QUEUED).count() == 30


def test_a_member_removed_meanwhile_queues_nothing(team, alice, django_user_model):
    carol = django_user_model.objects.create_user("carol")
    membership = Membership.objects.create(team=team, user=carol)
    sweep = expand(GPU, ["grpo"], [{}], [0, 1])
    membership.delete()  # between the checks a submission makes first and the queueing
    with pytest.raises(SweepError, match="you are not a member of team team-a"):
        create_experiment(team, carol, "late", "", sweep)
    assert not Experiment.objects.filter(name="late").exists()


def test_a_retry_racing_the_delete_of_its_experiment_answers_404_or_409(team, alice):
    token = ApiToken.issue(alice)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    statuses = []
    for _ in range(10):
        experiment = queue_sweep(team, alice, "doomed", config=GPU, seeds=[0, 1])
        experiment.cancel()
        runs = list(experiment.runs.values_list("pk", flat=True))
        statuses += together(
            [lambda pk=experiment.pk: Client().delete(f"/api/experiments/{pk}", **auth).status_code]
            + [lambda pk=pk: Client().post(f"/api/runs/{pk}/retry", **auth).status_code for pk in runs]
        )
    assert set(statuses) <= {200, 404, 409}, statuses
