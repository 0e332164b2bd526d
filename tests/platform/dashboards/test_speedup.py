"""The speed-up readout on constructed runs whose measured durations are known: each async or
distributed cell against its matching simulated cells, paired by seed, the geometric mean of the
per-seed ratios with its interval; contended runs left out unless asked for; and runs of another
compared experiment lend their on-policy baseline to a line that has none."""

from __future__ import annotations

import math

import pytest
from dashboard_helpers import CELLS, measured
from django.urls import reverse
from sample_experiments import make_finished_experiment

from experiments.models import Run

pytestmark = pytest.mark.django_db


def payload(client, experiment, **params):
    response = client.get(reverse("experiment-compare-data", args=[experiment.pk]), params)
    assert response.status_code == 200, response.content
    return response.json()


def readout(data, staleness, reference):
    return next(r for r in data["speedups"] if (r["staleness"], r["reference"]) == (staleness, reference))


def test_the_speedup_is_the_geometric_mean_of_per_seed_ratios_with_its_interval(alice_client, team, alice):
    seeds = (0, 1, 2, 3, 4)
    finals = {
        "on-policy": 0.60,
        "sync_offset=2": 0.55,
        "async ≤ 2": 0.50,
        "sync_offset=2 (distributed)": 0.55,
    }
    experiment = make_finished_experiment(
        team,
        alice,
        presets=("grpo",),
        staleness=CELLS,
        seeds=seeds,
        final_accuracy=lambda preset, label, seed: finals[label] + 0.01 * seed * (label == "async ≤ 2"),
    )
    # Simulated cells take 2 s a step; async seed s takes 2 / r_s s with r = 1.25, 1.6, 2, 2.5, 1.6;
    # the distributed cell exactly the simulated schedule's time, 2 s.
    ratios = {0: 1.25, 1: 1.6, 2: 2.0, 3: 2.5, 4: 1.6}
    for run in experiment.runs.all():
        if run.staleness == "async ≤ 2":
            run.summary = measured(2.0 / ratios[run.seed], 3.0)
        else:
            run.summary = measured(2.0, 2.0)
        run.save(update_fields=["summary"])

    data = payload(alice_client, experiment, metric="eval/accuracy")
    same_bound = readout(data, "async ≤ 2", "sync_offset=2")
    on_policy = readout(data, "async ≤ 2", "on-policy")
    expected = math.exp(sum(math.log(r) for r in ratios.values()) / 5)
    for row in (same_bound, on_policy):
        assert row["speedup"]["value"] == pytest.approx(expected, rel=1e-12)
        assert row["speedup"]["interval"] == "95% bootstrap CI" and row["speedup"]["n_pairs"] == 5
        assert 1.25 <= row["speedup"]["lo"] < expected < row["speedup"]["hi"] <= 2.5
        assert row["cpu_cost"]["value"] == pytest.approx(1.5) and row["cpu_cost"]["lo"] == pytest.approx(1.5)
        assert (row["n_pairs"], row["n_left_out"]) == (5, 0)
    # Accuracy given up: 0.50 + 0.01 s against 0.55 (the same bound) and 0.60 (on-policy), by seed.
    assert same_bound["accuracy_change"]["value"] == pytest.approx(-0.03)
    assert on_policy["accuracy_change"]["value"] == pytest.approx(-0.08)
    assert same_bound["against"] == "the same bound" and on_policy["against"] == "on-policy"
    distributed = readout(data, "sync_offset=2 (distributed)", "sync_offset=2")
    assert distributed["speedup"]["value"] == pytest.approx(1.0)
    assert distributed["accuracy_change"]["value"] == 0
    assert [r["staleness"] for r in data["speedups"]].count("sync_offset=2 (distributed)") == 1

    # Throughput: steady steps per hour from the measured steady wall-clock, cold start apart.
    rows = {r["staleness"]: r for r in data["throughput"]}
    assert rows["on-policy"]["steps_per_hour"] == pytest.approx(3600 / 1.5)
    assert rows["on-policy"]["cold_start_s"] == pytest.approx(10.0)
    assert rows["on-policy"]["tokens_per_cpu_s"] == pytest.approx(1000 / 2.0)


def test_two_seeds_give_the_min_max_and_contended_runs_are_left_out_unless_asked_for(
    alice_client, team, alice
):
    experiment = make_finished_experiment(
        team, alice, presets=("grpo",), staleness=CELLS[:3], seeds=(0, 1, 2)
    )
    walls = {0: 1.0, 1: 4 / 3, 2: 0.5}  # against 2 s: ratios 2, 1.5 and (contended) 4
    for run in experiment.runs.all():
        if run.staleness == "async ≤ 2":
            run.summary = measured(walls[run.seed], 1.0, contended=run.seed == 2)
        else:
            run.summary = measured(2.0, 1.0)
        run.save(update_fields=["summary"])

    row = readout(payload(alice_client, experiment), "async ≤ 2", "on-policy")
    assert row["speedup"]["value"] == pytest.approx(math.sqrt(3))
    assert (row["speedup"]["lo"], row["speedup"]["hi"]) == (pytest.approx(1.5), pytest.approx(2.0))
    assert row["speedup"]["interval"] == "min–max"
    assert (row["n_pairs"], row["n_left_out"]) == (2, 1)
    throughput = next(
        r for r in payload(alice_client, experiment)["throughput"] if r["staleness"] == "async ≤ 2"
    )
    assert (throughput["n_seeds"], throughput["n_contended"]) == (2, 1)

    shown = payload(alice_client, experiment, contended="1")
    assert shown["contended"] is True
    row = readout(shown, "async ≤ 2", "on-policy")
    assert row["speedup"]["value"] == pytest.approx((2 * 1.5 * 4) ** (1 / 3)) and row["n_pairs"] == 3


def test_bad_contended_parameter_is_named(alice_client, team, alice):
    experiment = make_finished_experiment(team, alice, presets=("grpo",), seeds=(0,))
    response = alice_client.get(
        reverse("experiment-compare-data", args=[experiment.pk]), {"contended": "yes"}
    )
    assert response.status_code == 400 and "contended must be 0" in response.content.decode()


def test_a_line_without_on_policy_runs_borrows_them_from_another_compared_experiment(
    alice_client, team, alice
):
    baseline = make_finished_experiment(team, alice, "baseline", presets=("grpo",), staleness=({},))
    stale = make_finished_experiment(
        team, alice, "stale", presets=("grpo",), staleness=({"mode": "async", "max_staleness": 2},)
    )
    ids = list(Run.objects.filter(experiment__in=[baseline, stale]).values_list("pk", flat=True))
    response = alice_client.get(
        reverse("runs-compare-data"), {"runs": ",".join(map(str, ids)), "metric": "reward/mean"}
    )
    assert response.status_code == 200, response.content
    data = response.json()
    assert data["borrowed"] == [{"experiment": stale.pk, "preset": "grpo", "from_experiment": baseline.pk}]
    drop = next(d for d in data["drops"] if d["experiment"] == stale.pk)
    assert drop["staleness"] == "async ≤ 2" and drop["baseline"] == {
        "staleness": "on-policy",
        "experiment": baseline.pk,
    }
    assert drop["n_seeds"] == 2
    # Alone, the stale experiment has no baseline and no drop.
    alone = payload(alice_client, stale, metric="reward/mean")
    assert alone["drops"] == [] and alone["borrowed"] == []


def test_an_experiment_with_another_config_lends_no_baseline(alice_client, team, alice):
    baseline = make_finished_experiment(team, alice, "baseline", presets=("grpo",), staleness=({},))
    stale = make_finished_experiment(
        team, alice, "stale", presets=("grpo",), staleness=({"mode": "async", "max_staleness": 2},)
    )
    for run in stale.runs.all():  # trained with another learning rate
        run.config = {**run.config, "optimizer": {**run.config["optimizer"], "lr": 1e-4}}
        run.save(update_fields=["config"])
    ids = list(Run.objects.filter(experiment__in=[baseline, stale]).values_list("pk", flat=True))
    data = alice_client.get(
        reverse("runs-compare-data"), {"runs": ",".join(map(str, ids)), "metric": "reward/mean"}
    )
    assert data.json()["borrowed"] == [] and not [
        d for d in data.json()["drops"] if d["experiment"] == stale.pk
    ]


def test_each_pair_shows_the_outside_load_its_runs_ran_under(alice_client, team, alice):
    """A drift in outside load between the cells compared shows beside their ratio."""
    experiment = make_finished_experiment(team, alice, presets=("grpo",), staleness=CELLS, seeds=(0, 1))
    for run in experiment.runs.all():
        run.summary = measured(1.0 if run.staleness == "async ≤ 2" else 2.0, 1.0)
        run.summary["machine/others_cores"] = 0.3 if run.staleness == "async ≤ 2" else 0.1 + 0.1 * run.seed
        run.save(update_fields=["summary"])
    row = readout(payload(alice_client, experiment), "async ≤ 2", "sync_offset=2")
    assert row["others_cores"] == pytest.approx(0.3)
    assert row["reference_others_cores"] == pytest.approx(0.15), "the mean of 0.1 and 0.2"


@pytest.mark.django_db(transaction=True)
def test_when_every_run_ran_contended_the_readout_says_so_first_and_draws_no_empty_chart(
    page, live_server, team, alice
):
    experiment = make_finished_experiment(team, alice, presets=("grpo",), staleness=CELLS[:3], seeds=(0, 1))
    for run in experiment.runs.all():
        run.summary = measured(2.0, 2.0, contended=True)
        run.summary["machine/others_cores"] = (
            0.9 + 0.1 * run.seed + (0.5 if run.staleness == "on-policy" else 0)
        )
        run.save(update_fields=["summary"])
    page.goto(live_server.url + reverse("experiment-compare", args=[experiment.pk]))
    page.wait_for_selector("#speedups tr[data-preset=grpo]")
    assert page.is_visible("#answer-speedups"), "an async cell: the speed-up is one of the page's answers"
    note = page.text_content("#speedups-contended")
    assert note.startswith(
        "All 6 runs of these cells ran contended: 0.9–1.5 cores used by other processes"
    ), note
    assert page.is_hidden("#speedup-chart"), "no empty chart"
    page.click("#speedups-contended a")
    page.wait_for_url("**contended=1**")
    page.wait_for_function(
        "() => document.getElementById('speedup-chart').querySelector('.main-svg') !== null"
    )
    assert page.is_hidden("#speedups-contended") and page.is_visible("#speedup-chart")
    # Counted, the answer card at the top states each cell's speed-up and its accuracy change.
    assert page.is_visible("#answer-speedups")
    card = page.locator("#answer-speedups li[data-preset=grpo]").all_text_contents()
    assert len(card) == 2 and all("× [" in line and "eval/accuracy change" in line for line in card), card
