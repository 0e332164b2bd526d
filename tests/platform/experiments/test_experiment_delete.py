"""Deleting an experiment: team admins only, after a confirmation page that says what goes,
never while a run is queued or running, and the runs' folders go too."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.conf import settings
from django.test import Client
from django.urls import reverse
from support import log_points

from accounts.models import ApiToken
from experiments.models import Experiment, MetricChunk, MetricSummary, Run

pytestmark = pytest.mark.django_db(transaction=True)  # folders are removed once the delete commits


@pytest.fixture
def experiment(make_experiment):
    experiment = make_experiment("doomed", seeds=[0, 1])
    now = datetime.now(UTC)
    for run in experiment.runs.all():
        log_points(run, [("loss", step, 1.0 / step, now) for step in (1, 2, 3)])
        run.checkpoint_dir.mkdir(parents=True)
        (run.checkpoint_dir / "step-2.pt").write_bytes(b"weights")
        run.buffer_dir.mkdir()
    return experiment


@pytest.fixture
def member_client(team, django_user_model):
    from accounts.models import Membership

    carol = django_user_model.objects.create_user("carol")
    Membership.objects.create(team=team, user=carol)
    browser = Client()
    browser.force_login(carol)
    return browser


def run_folders(experiment) -> list:
    return [settings.LAB_RUNS_DIR / str(key) for key in experiment.runs.values_list("key", flat=True)]


def test_an_admin_confirms_and_the_runs_points_and_folders_go(alice_client, experiment):
    experiment.cancel()
    folders = run_folders(experiment)
    assert all(folder.is_dir() for folder in folders)
    url = reverse("experiment-delete", args=[experiment.pk])

    confirm = alice_client.get(url).content.decode()
    assert "2 runs" in confirm and "6 metric points" in confirm and 'id="confirm-delete"' in confirm
    assert Experiment.objects.filter(pk=experiment.pk).exists()

    response = alice_client.post(url, follow=True)
    assert response.redirect_chain[-1][0] == reverse("experiment-list")
    assert "Deleted doomed" in response.content.decode()
    assert not Experiment.objects.filter(pk=experiment.pk).exists()
    assert (
        Run.objects.count() == 0 and MetricChunk.objects.count() == 0 and MetricSummary.objects.count() == 0
    )
    assert not any(folder.exists() for folder in folders)


def test_it_is_refused_while_runs_are_active(alice_client, experiment):
    url = reverse("experiment-delete", args=[experiment.pk])
    confirm = alice_client.get(url).content.decode()
    assert "cancel it first" in confirm and 'id="confirm-delete"' not in confirm

    response = alice_client.post(url, follow=True)
    assert "Not deleted: doomed has 2 queued or running runs; cancel it first" in response.content.decode()
    assert experiment.runs.count() == 2 and all(folder.is_dir() for folder in run_folders(experiment))


def test_a_plain_member_cannot_delete(member_client, experiment):
    experiment.cancel()
    url = reverse("experiment-delete", args=[experiment.pk])
    for response in (member_client.get(url, follow=True), member_client.post(url, follow=True)):
        assert "Only admins of team-a can delete its experiments" in response.content.decode()
    assert experiment.runs.count() == 2


def test_the_api_deletes_for_admins_only_and_not_while_active(
    client, alice, member_client, experiment, django_user_model
):
    carol = django_user_model.objects.get(username="carol")
    url = f"/api/experiments/{experiment.pk}"
    as_alice = {"HTTP_AUTHORIZATION": f"Bearer {ApiToken.issue(alice)}"}
    as_carol = {"HTTP_AUTHORIZATION": f"Bearer {ApiToken.issue(carol)}"}

    active = client.delete(url, **as_alice)
    assert active.status_code == 409 and "cancel it first" in active.json()["detail"]
    experiment.cancel()
    assert client.delete(url, **as_carol).status_code == 403
    folders = run_folders(experiment)

    deleted = client.delete(url, **as_alice)
    assert deleted.json() == {"experiment": experiment.pk, "runs": 2, "points": 6, "completions": 0}
    assert not Experiment.objects.exists() and not any(folder.exists() for folder in folders)
    assert client.delete(url, **as_alice).status_code == 404
