"""Fair sharing between teams: workers take the teams' runs in turns (first in, first out within a
team), a team at `LAB_TEAM_MAX_RUNNING` waits, and a submission or retry that would take a team
over `LAB_TEAM_MAX_QUEUED` queued runs is refused, naming the limit."""

from __future__ import annotations

import copy

import pytest
from django.test import override_settings
from django.urls import reverse
from support import TINY_CONFIG, new_team_member, sweep_form

from accounts.models import ApiToken
from experiments.models import Experiment, Run
from experiments.progress import run_progress

pytestmark = pytest.mark.django_db


@pytest.fixture
def bob_team(db):
    return new_team_member("bob", "team-b").memberships.get().team


def api_submit(client, user, team: str, seeds: int):
    body = {"name": f"{team} sweep", "team": team, "config": copy.deepcopy(TINY_CONFIG), "presets": ["grpo"]}
    return client.post(
        "/api/sweeps",
        {**body, "seeds": list(range(seeds))},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {ApiToken.issue(user)}",
    )


def team_of(run: Run | None) -> str | None:
    return run.experiment.team.name if run else None


@pytest.fixture
def a_many_then_b_one(client, alice, team, bob_team) -> tuple[list[int], int]:
    """Team A submits 8 runs, then team B one, through the API."""
    a = api_submit(client, alice, "team-a", 8)
    b = api_submit(client, bob_team.members.get(), "team-b", 1)
    assert (a.status_code, b.status_code) == (201, 201), (a.content, b.content)
    return a.json()["runs"], b.json()["runs"][0]


def test_with_several_workers_the_other_teams_run_starts_second(a_many_then_b_one):
    a_runs, b_run = a_many_then_b_one
    claimed = [Run.claim_next("cpu", f"w{i}:1") for i in range(len(a_runs) + 2)]
    assert [run.pk if run else None for run in claimed] == [a_runs[0], b_run, *a_runs[1:], None]


def test_with_one_worker_the_teams_alternate(a_many_then_b_one):
    a_runs, b_run = a_many_then_b_one
    order = []
    while (run := Run.claim_next("cpu", "w1:1")) is not None:
        order.append(run.pk)
        assert run.finish("w1:1", {})
    assert order == [a_runs[0], b_run, *a_runs[1:]], "B's run goes before 7 of A's 8"


def test_first_in_first_out_within_a_team(client, alice, team):
    first = api_submit(client, alice, "team-a", 2).json()["runs"]
    later = api_submit(client, alice, "team-a", 1).json()["runs"]
    order = [Run.claim_next("cpu", f"w{i}:1").pk for i in range(3)]
    assert order == [*first, *later]


@override_settings(LAB_TEAM_MAX_RUNNING=2)
def test_a_team_at_its_running_cap_waits_and_others_go_ahead(client, alice, team, bob_team):
    api_submit(client, alice, "team-a", 4)
    assert [team_of(Run.claim_next("cpu", f"w{i}:1")) for i in range(3)] == ["team-a", "team-a", None]
    assert Run.objects.filter(status=Run.QUEUED).count() == 2, "A's other runs wait"
    api_submit(client, bob_team.members.get(), "team-b", 1)
    assert team_of(Run.claim_next("cpu", "w3:1")) == "team-b"
    done = Run.objects.filter(status=Run.RUNNING, experiment__team=team).first()
    assert done.finish(done.worker, {})
    assert team_of(Run.claim_next("cpu", "w4:1")) == "team-a", "a slot freed: A's next run starts"


@override_settings(LAB_TEAM_MAX_QUEUED=3)
def test_a_submission_over_the_queued_cap_is_a_422_naming_the_limit(client, alice, team, bob_team):
    assert api_submit(client, alice, "team-a", 2).status_code == 201
    response = api_submit(client, alice, "team-a", 2)
    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["field"] == "team"
    assert "team-a has 2 queued runs; 2 more would exceed the limit of 3" in error["msg"]
    assert "LAB_TEAM_MAX_QUEUED" in error["msg"]
    assert Experiment.objects.filter(team=team).count() == 1, "nothing stored"
    assert api_submit(client, bob_team.members.get(), "team-b", 3).status_code == 201, "per team"
    Run.claim_next("cpu", "w1:1")  # one of A's starts: it is no longer queued
    assert api_submit(client, alice, "team-a", 2).status_code == 201


@override_settings(LAB_TEAM_MAX_QUEUED=3)
def test_the_form_refuses_a_sweep_over_the_queued_cap_next_to_the_team(alice_client, team):
    data = sweep_form(
        team,
        "too many",
        seeds="0, 1, 2, 3",
        fields={
            "task.name": "arithmetic",
            "steps": "6",
        },
    )
    response = alice_client.post(reverse("submit-sweep"), data)
    assert response.status_code == 422
    [error] = response.context["form"].errors["team"]
    assert "the limit of 3 queued runs per team (LAB_TEAM_MAX_QUEUED)" in error
    assert Run.objects.count() == 0


@override_settings(LAB_TEAM_MAX_QUEUED=2)
def test_a_retry_over_the_queued_cap_is_refused(client, alice, team):
    [first, *_] = api_submit(client, alice, "team-a", 2).json()["runs"]
    run = Run.claim_next("cpu", "w1:1")
    assert run.pk == first and run.fail("w1:1", "RuntimeError: boom")
    api_submit(client, alice, "team-a", 1)
    response = client.post(f"/api/runs/{run.pk}/retry", HTTP_AUTHORIZATION=f"Bearer {ApiToken.issue(alice)}")
    assert response.status_code == 409
    assert "the limit of 2 queued runs per team (LAB_TEAM_MAX_QUEUED)" in response.json()["detail"]
    run.refresh_from_db()
    assert (run.status, run.attempt) == (Run.FAILED, 1)


@override_settings(LAB_TEAM_MAX_RUNNING=1)
def test_a_waiting_run_says_where_it_stands_and_what_it_waits_for(a_many_then_b_one, bob_team):
    a_runs, b_run = a_many_then_b_one
    taken = Run.claim_next("cpu", "w1:1")
    assert taken.pk == a_runs[0]
    b = Run.objects.get(pk=b_run)
    report = run_progress(b)
    assert report["queue_position"] == 1
    assert report["text"] == (
        "waiting for a worker: next of its team's runs on queue cpu · the workers of queue cpu are running "
        "1 run of other teams: teams take turns (fair share), so its team's next run starts when one ends"
    )
    fourth = run_progress(Run.objects.get(pk=a_runs[3]))
    assert fourth["queue_position"] == 3 and fourth["text"] == (
        "waiting for a worker: 2 of its team's runs ahead of it on queue cpu · its team is at its limit "
        "of 1 running run (LAB_TEAM_MAX_RUNNING)"
    )
