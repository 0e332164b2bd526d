"""Cancelling a whole experiment: every queued or running run, from its page or the API."""

from __future__ import annotations

import pytest
from django.urls import reverse

from accounts.models import ApiToken
from experiments.models import RolloutJob, Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def experiment(make_experiment):
    experiment = make_experiment("three seeds", seeds=[0, 1, 2])
    first, second, third = experiment.runs.order_by("pk")
    first.claim("w1:1", first.attempt)
    RolloutJob.objects.create(run=first, step=1, groups_start=0, groups_stop=4)
    third.cancel()
    return experiment


def statuses(experiment) -> list[tuple[str, bool]]:
    return [(run.status, run.cancel_requested is not None) for run in experiment.runs.order_by("pk")]


def test_the_button_cancels_queued_runs_and_asks_running_ones_to_stop(alice_client, experiment):
    page = alice_client.get(reverse("experiment-detail", args=[experiment.pk])).content.decode()
    assert reverse("experiment-cancel", args=[experiment.pk]) in page

    response = alice_client.post(reverse("experiment-cancel", args=[experiment.pk]), follow=True)
    assert "Cancelled 2 runs" in response.content.decode()
    assert statuses(experiment) == [
        (Run.RUNNING, True),
        (Run.CANCELLED, True),
        (Run.CANCELLED, True),
    ]
    assert list(RolloutJob.objects.values_list("status", flat=True)) == [RolloutJob.CANCELLED]

    again = alice_client.post(reverse("experiment-cancel", args=[experiment.pk]), follow=True)
    assert "nothing to cancel" in again.content.decode()


def test_the_api_says_how_many_runs_it_cancelled(client, alice, experiment):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {ApiToken.issue(alice)}"}
    url = f"/api/experiments/{experiment.pk}/cancel"
    assert client.post(url, **auth).json() == {"cancelled": 2}
    assert client.post(url, **auth).json() == {"cancelled": 0}
    assert experiment.runs.filter(status=Run.QUEUED).count() == 0


def test_cancelling_all_active_runs_asks_first(alice_client, experiment):
    confirm = alice_client.get(reverse("experiment-cancel", args=[experiment.pk])).content.decode()
    assert "1 queued run stops at once, and\n    1 running run after its current step" in confirm
    assert statuses(experiment)[:2] == [(Run.RUNNING, False), (Run.QUEUED, False)], "nothing cancelled yet"
    detail = alice_client.get(reverse("experiment-detail", args=[experiment.pk])).content.decode()
    assert f'<a id="cancel-all" href="{reverse("experiment-cancel", args=[experiment.pk])}">' in detail
