"""Comparing hand-picked runs of several experiments: `?runs=…` on the runs page, the dashboard
and its data. A line is one preset of one experiment (seeds of two experiments are never
averaged together); bad or foreign run ids are a 400 naming `runs`."""

from __future__ import annotations

import csv
import io

import pytest
from django.urls import reverse
from sample_experiments import make_finished_experiment
from support import new_team_member

from accounts.models import Membership, Team
from experiments.models import Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def experiments(team, alice):
    first = make_finished_experiment(team, alice, name="first")
    second = make_finished_experiment(team, alice, name="second", presets=("grpo",), seeds=(0, 1, 2))
    return first, second


def picked(experiment, **filters) -> list[int]:
    return list(experiment.runs.filter(**filters).values_list("pk", flat=True))


def data(client, run_ids, view="runs-compare-data", **params):
    params.setdefault("metric", "reward/mean")  # the sample's formula; the page opens on eval/accuracy
    return client.get(reverse(view), {"runs": ",".join(map(str, run_ids)), **params})


def test_lines_are_one_preset_of_one_experiment_and_seeds_stay_in_their_experiment(alice_client, experiments):
    first, second = experiments
    ids = picked(first, staleness="on-policy") + picked(second, staleness="on-policy")
    response = data(alice_client, ids)
    assert response.status_code == 200, response.content
    payload = response.json()
    assert payload["experiments"] == [{"id": first.pk, "name": "first"}, {"id": second.pk, "name": "second"}]
    assert [line["line"] for line in payload["lines"]] == [
        f"reinforce · #{first.pk} first",
        f"grpo · #{first.pk} first",
        f"grpo · #{second.pk} second",
    ]
    assert payload["staleness"] == ["on-policy"]
    grpo = {g["experiment"]: g for g in payload["groups"] if g["preset"] == "grpo"}
    assert (grpo[first.pk]["n_seeds"], grpo[second.pk]["n_seeds"]) == (2, 3)
    # At the end, 0.5 + 0.25 × (grpo's index in its sweep) + 0.05 × seed: seeds 0, 1 of the
    # first (grpo second in its sweep), seeds 0, 1, 2 of the second (grpo alone).
    assert grpo[first.pk]["mean"][-1] == pytest.approx(0.75 + 0.025)
    assert grpo[second.pk]["mean"][-1] == pytest.approx(0.5 + 0.05)
    assert sorted(r["id"] for r in payload["runs"]) == sorted(ids)
    assert {r["line"] for r in payload["runs"] if r["experiment"] == second.pk} == {
        f"grpo · #{second.pk} second"
    }


def test_runs_of_one_experiment_are_labelled_by_preset_alone(alice_client, experiments):
    first, _ = experiments
    payload = data(alice_client, picked(first, seed=0)).json()
    assert [line["line"] for line in payload["lines"]] == ["reinforce", "grpo"]
    assert all(g["n_seeds"] == 1 for g in payload["groups"])


def test_summary_and_csv_of_picked_runs_name_the_experiment(alice_client, experiments):
    first, second = experiments
    ids = picked(first, preset="grpo") + picked(second)
    summary = data(alice_client, ids, view="runs-compare-summary").json()["summary"]
    assert {(r["experiment"], r["staleness"]) for r in summary} == {
        (e.pk, s) for e in (first, second) for s in ("on-policy", "sync_offset=2")
    }
    response = data(alice_client, ids, view="runs-compare-summary", format="csv")
    assert response["Content-Disposition"] == 'attachment; filename="runs-reward-mean-last-summary.csv"'
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert {(int(r["experiment"]), r["preset"]) for r in rows} == {(first.pk, "grpo"), (second.pk, "grpo")}
    curves_csv = list(csv.DictReader(io.StringIO(data(alice_client, ids, format="csv").content.decode())))
    assert {int(r["experiment"]) for r in curves_csv} == {first.pk, second.pk}


@pytest.mark.parametrize(
    ("runs", "message"),
    [
        ("", "runs must name 1 to 500 runs (got 0)"),
        ("1,x", "runs must be run ids (whole numbers) separated by commas (got 'x')"),
        (",".join(str(i) for i in range(1, 502)), "runs must name 1 to 500 runs (got 501)"),
        ("999999", "no run 999999 in your teams"),
    ],
)
def test_bad_run_ids_are_a_400_naming_runs(alice_client, experiments, runs, message):
    for view in ("runs-compare-data", "runs-compare-summary"):
        response = alice_client.get(reverse(view), {"runs": runs})
        assert response.status_code == 400
        assert response.json() == {"detail": [{"param": "runs", "msg": message}]}


def test_runs_of_other_teams_cannot_be_picked(client, experiments, django_user_model):
    first, _ = experiments
    bob = new_team_member("bob", "team-b", is_admin=False)
    ids = picked(first)
    assert data(client, ids).status_code == 302, "anonymous users log in first"
    client.force_login(bob)
    response = data(client, ids)
    assert response.status_code == 400 and "in your teams" in response.json()["detail"][0]["msg"]
    page = client.get(reverse("runs-compare"), {"runs": ids[0]})
    assert page["Location"] == reverse("run-list")
    listing = client.get(reverse("run-list")).content.decode()
    assert "No runs match." in listing


def test_the_runs_page_filters_and_links_picked_runs_to_the_dashboard(alice_client, experiments):
    first, second = experiments
    html = alice_client.get(
        reverse("run-list"), {"preset": "grpo", "staleness": "on-policy"}
    ).content.decode()
    shown = picked(first, preset="grpo", staleness="on-policy") + picked(second, staleness="on-policy")
    for pk in shown:
        assert f'name="runs" value="{pk}"' in html
    assert html.count('name="runs"') == len(shown)
    assert f'action="{reverse("runs-compare")}"' in html
    page = alice_client.get(reverse("runs-compare"), {"runs": shown}).content.decode()
    ids = ",".join(map(str, sorted(shown)))
    assert f'data-runs="{ids}"' in page and "Compare selected runs" in page
    assert f'href="{reverse("experiment-detail", args=[second.pk])}"' in page
    detail = alice_client.get(reverse("experiment-detail", args=[first.pk])).content.decode()
    assert f'href="{reverse("run-list")}?experiment={first.pk}"' in detail


def test_names_on_the_picked_runs_pages_are_escaped(alice_client, team, alice):
    experiment = make_finished_experiment(team, alice, name="<script>alert(1)</script>", seeds=(0,))
    ids = picked(experiment)
    for response in (
        alice_client.get(reverse("run-list")),
        alice_client.get(reverse("runs-compare"), {"runs": ids}),
    ):
        html = response.content.decode()
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script>alert(1)" not in html
    assert Run.objects.count() == len(ids)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"team": "abc"}, "team must be the id of a team (got &#x27;abc&#x27;); not filtered"),
        ({"experiment": "9" * 30}, "experiment must be the id of an experiment"),
        ({"preset": "grpo\x00"}, "preset must be at most 100 characters, without NUL; not filtered"),
        ({"staleness": "x" * 101}, "staleness must be at most 100 characters, without NUL; not filtered"),
    ],
)
def test_bad_filters_on_the_runs_page_are_named_and_ignored(alice_client, experiments, params, message):
    response = alice_client.get(reverse("run-list"), params)
    assert response.status_code == 200
    html = response.content.decode()
    assert message in html
    assert html.count('name="runs"') == Run.objects.count(), "the bad filter is left out"


def test_an_unknown_experiment_id_on_the_runs_page_shows_no_runs(alice_client, experiments):
    html = alice_client.get(reverse("run-list"), {"experiment": "9" * 18}).content.decode()
    assert "No runs match." in html


def test_staleness_settings_are_ordered_by_how_stale_their_data_is(alice_client, team, alice):
    from dashboards.comparison.grouping import staleness_rank

    make_finished_experiment(
        team,
        alice,
        name="odd",
        staleness=({"sync_offset": 4}, {"offline": True}, {}, {"sync_interval": 3}),
        seeds=(0,),
    )
    ids = ",".join(str(pk) for pk in Run.objects.values_list("pk", flat=True))
    payload = alice_client.get(reverse("runs-compare-data"), {"runs": ids}).json()
    # Mean lag over 6 steps: on-policy 0, sync_interval=3 1, sync_offset=4 14/6 (v = 0 until step 5), offline 2.5.
    assert payload["staleness"] == ["on-policy", "sync_interval=3", "sync_offset=4", "offline"]
    assert staleness_rank({"steps": 6, "staleness": {"sync_offset": 4}}) == pytest.approx(14 / 6)
    assert staleness_rank({"steps": 6, "execution": {"mode": "async", "max_staleness": 2}}) == 2


def test_a_permalink_with_runs_of_another_team_shows_the_visible_ones_with_a_note(
    alice_client, experiments, django_user_model
):
    first, _ = experiments
    bob = django_user_model.objects.create_user("bob", password="bob-password-1")
    theirs = make_finished_experiment(
        Team.objects.create(name="team-b"), bob, name="theirs", presets=("grpo",), seeds=(0,)
    )
    Membership.objects.create(team=theirs.team, user=bob)
    mine = picked(first, staleness="on-policy")
    response = alice_client.get(reverse("runs-compare"), {"runs": ",".join(map(str, mine + picked(theirs)))})
    assert response.status_code == 200
    html = response.content.decode()
    assert f'data-runs="{",".join(map(str, sorted(mine)))}"' in html, "the dashboard draws the visible runs"
    assert f"{len(picked(theirs))} of the {len(mine) + len(picked(theirs))} linked runs" in html
    assert "theirs" not in html, "nothing of the other team's runs is told"
