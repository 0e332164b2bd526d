"""Add seeds to an experiment: every cell of its sweep queued again with the next seeds, into the
same experiment (its comparison, claims and reports pick them up), through the API, a
confirmation page, and the link beside a claim that more seeds would settle."""

from __future__ import annotations

import json

import pytest
from django.test import override_settings
from django.urls import reverse
from support import TINY_CONFIG, new_team_member, queue_sweep, queued_messages

from accounts.models import ApiToken
from experiments.models import Run
from experiments.sweeps import create_experiment, expand

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sweep(team, alice):
    return queue_sweep(
        team,
        alice,
        "four cells",
        presets=("grpo", "reinforce"),
        staleness=({}, {"sync_offset": 2}),
        seeds=(0, 1),
    )


def post(client, token, path, body):
    return client.post(
        f"/api{path}", json.dumps(body), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )


def cells(runs):
    return {(r.preset, r.staleness, json.dumps({**r.config, "seed": None}, sort_keys=True)) for r in runs}


def test_the_api_queues_every_cell_again_with_the_next_seeds(client, alice, sweep):
    token = ApiToken.issue(alice)
    before = list(sweep.runs.all())
    messages = queued_messages()
    answer = post(client, token, f"/experiments/{sweep.pk}/seeds", {"seeds": 2})
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert body["experiment"] == sweep.pk and body["seeds"] == [2, 3] and len(body["runs"]) == 8
    added = list(Run.objects.filter(pk__in=body["runs"]))
    assert all(r.experiment_id == sweep.pk and r.status == Run.QUEUED for r in added)
    assert sorted({r.seed for r in added}) == [2, 3] and cells(added) == cells(before), "the same cells"
    sweep.refresh_from_db()
    assert sweep.spec["seeds"] == [0, 1, 2, 3]
    assert queued_messages() == messages + 8
    assert post(client, token, f"/experiments/{sweep.pk}/seeds", {"seeds": 1}).json()["seeds"] == [4]


def test_bad_counts_the_cap_and_other_teams_are_refused_queuing_nothing(client, alice, sweep):
    token = ApiToken.issue(alice)
    for seeds in (0, 65, "two"):
        refused = post(client, token, f"/experiments/{sweep.pk}/seeds", {"seeds": seeds})
        assert refused.status_code == 422 and refused.json()["detail"][0]["loc"][-1] == "seeds"
    with override_settings(LAB_TEAM_MAX_QUEUED=10):
        refused = post(client, token, f"/experiments/{sweep.pk}/seeds", {"seeds": 1})
    assert refused.status_code == 422 and refused.json()["detail"][0]["field"] == "team"
    assert "LAB_TEAM_MAX_QUEUED" in refused.json()["detail"][0]["msg"]
    bob = new_team_member("bob", "team-b")
    assert (
        post(client, ApiToken.issue(bob), f"/experiments/{sweep.pk}/seeds", {"seeds": 1}).status_code == 404
    )
    assert sweep.runs.count() == 8


def test_the_page_says_what_it_queues_then_queues_it(alice_client, sweep):
    url = reverse("experiment-seeds", args=[sweep.pk])
    assert f'href="{url}"' in alice_client.get(reverse("experiment-detail", args=[sweep.pk])).content.decode()
    page = alice_client.get(url, {"n": "3"}).content.decode()
    assert "Seeds 2, 3, 4: 12 runs to queue." in page and "It has seeds 0, 1." in page
    assert sweep.runs.count() == 8, "asking queues nothing"
    bad = alice_client.post(url, {"n": "lots"})
    assert bad.status_code == 422 and "add 1 to 64 seeds at a time" in bad.content.decode()
    assert alice_client.post(url, {"n": "3"}).status_code == 302
    assert sorted(set(sweep.runs.values_list("seed", flat=True))) == [0, 1, 2, 3, 4]


def test_a_serial_sweep_queues_its_runs_round_robin_by_seed(team, alice):
    """Measured one at a time, first in first out: every cell's seed 0, then every cell's seed 1, …
    (blocks of one cell's seeds let a drift in outside load fall between the cells compared)."""
    grid = expand(TINY_CONFIG, ["grpo", "m2po"], [{}, {"sync_offset": 4}], [0, 1, 2], serial=True)
    experiment = create_experiment(team, alice, "serial", "", grid)
    order = list(experiment.runs.order_by("pk").values_list("seed", "preset", "staleness"))
    cells = [
        ("grpo", "on-policy"),
        ("grpo", "sync_offset=4"),
        ("m2po", "on-policy"),
        ("m2po", "sync_offset=4"),
    ]
    assert order == [(seed, *cell) for seed in (0, 1, 2) for cell in cells]
    experiment = create_experiment(team, alice, "at once", "", expand(TINY_CONFIG, ["grpo"], [{}], [0, 1, 2]))
    assert list(experiment.runs.order_by("pk").values_list("seed", flat=True)) == [0, 1, 2]
