"""Archiving hides an experiment and its runs from the lists, keeps everything, and is undone
by unarchiving; any team member may do either."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from accounts.models import ApiToken, Membership
from experiments.models import Experiment

pytestmark = pytest.mark.django_db


@pytest.fixture
def experiments(make_experiment):
    return [make_experiment(name) for name in ("keep-me-shown", "tuck-me-away")]


def listed(client, url: str) -> str:
    return client.get(url).content.decode()


def test_a_member_archives_and_unarchives_from_the_page(client, team, experiments, django_user_model):
    shown, hidden = experiments
    member = django_user_model.objects.create_user("carol")
    Membership.objects.create(team=team, user=member)
    client.force_login(member)

    client.post(reverse("experiment-archive", args=[hidden.pk]), follow=True)
    hidden.refresh_from_db()
    assert hidden.archived is not None

    experiment_list = listed(client, reverse("experiment-list"))
    assert "keep-me-shown" in experiment_list and "tuck-me-away" not in experiment_list
    with_archived = listed(client, reverse("experiment-list") + "?archived=1")
    assert "tuck-me-away" in with_archived and "(archived)" in with_archived

    run_list = listed(client, reverse("run-list"))
    assert f'name="runs" value="{shown.runs.get().pk}"' in run_list
    assert f'name="runs" value="{hidden.runs.get().pk}"' not in run_list
    assert f'name="runs" value="{hidden.runs.get().pk}"' in listed(
        client, reverse("run-list") + "?archived=1"
    )
    detail = listed(client, reverse("experiment-detail", args=[hidden.pk]))
    assert 'id="archived"' in detail and f"?experiment={hidden.pk}&amp;archived=1" in detail

    client.post(reverse("experiment-unarchive", args=[hidden.pk]), follow=True)
    hidden.refresh_from_db()
    assert hidden.archived is None
    assert "tuck-me-away" in listed(client, reverse("experiment-list"))
    assert f'name="runs" value="{hidden.runs.get().pk}"' in listed(client, reverse("run-list"))
    assert Experiment.objects.count() == 2 and hidden.runs.count() == 1


def test_archive_posts_need_csrf(alice, experiments):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)
    assert browser.post(reverse("experiment-archive", args=[experiments[1].pk])).status_code == 403
    experiments[1].refresh_from_db()
    assert experiments[1].archived is None


def test_the_api_archives_and_lists_archived_on_request(client, alice, experiments):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {ApiToken.issue(alice)}"}
    hidden = experiments[1]
    archived = client.post(f"/api/experiments/{hidden.pk}/archive", **auth).json()
    assert archived["id"] == hidden.pk and archived["archived"] is not None and archived["runs"] == 1

    assert [e["name"] for e in client.get("/api/experiments", **auth).json()["items"]] == ["keep-me-shown"]
    everything = client.get("/api/experiments?archived=true", **auth).json()["items"]
    assert [(e["name"], e["archived"] is None) for e in everything] == [
        ("tuck-me-away", False),
        ("keep-me-shown", True),
    ]

    assert client.post(f"/api/experiments/{hidden.pk}/unarchive", **auth).json()["archived"] is None
    assert client.get("/api/experiments", **auth).json()["count"] == 2
