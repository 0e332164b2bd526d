"""The comparison of a sweep with another axis (`optimizer.minibatches: [1, 2]`) besides presets,
staleness and seeds: a line per preset and variant, drops and ties paired within a variant, the
"Changing one varied field" contrasts paired by seed within every other field, and the page's
panels and colours split by any varied field (in a real headless Chromium)."""

from __future__ import annotations

import csv
import io

import pytest
from django.urls import reverse
from sample_experiments import make_finished_experiment
from support import TEST_VAR

AXES = {"optimizer.minibatches": [1, 2]}


def final(preset: str, staleness: str, seed: int, variant: dict) -> float:
    """grpo loses 0.05 with 2 mini-batches, reinforce nothing; staleness costs 0.1 everywhere."""
    value = 0.6 + 0.01 * seed - (0.1 if staleness != "on-policy" else 0.0)
    if preset == "grpo" and variant["optimizer.minibatches"] == 2:
        value -= 0.05
    return value


def finished(team, alice, seeds):
    return make_finished_experiment(
        team,
        alice,
        name="minibatches",
        presets=("reinforce", "grpo"),
        staleness=({}, {"sync_offset": 2}),
        seeds=seeds,
        final_accuracy=final,
        axes=AXES,
    )


@pytest.fixture
def experiment(team, alice):
    return finished(team, alice, seeds=range(5))


def payload(client, experiment, **params):
    response = client.get(
        reverse("experiment-compare-data", args=[experiment.pk]), {"metric": "eval/accuracy", **params}
    )
    assert response.status_code == 200
    return response.json()


@pytest.mark.django_db
def test_lines_drops_ties_and_contrasts_pair_within_the_other_fields(alice_client, experiment):
    data = payload(alice_client, experiment)
    assert [line["line"] for line in data["lines"]] == [
        "reinforce · minibatches=1",
        "reinforce · minibatches=2",
        "grpo · minibatches=1",
        "grpo · minibatches=2",
    ]
    assert data["fields"][2] == {"name": "optimizer.minibatches", "label": "minibatches", "values": [1, 2]}
    # Each line's drop from its own on-policy runs: the same variant's.
    drops = {(d["line"], d["staleness"]): d["value"] for d in data["drops"]}
    assert drops == {(line["line"], "sync_offset=2"): pytest.approx(-0.1) for line in data["lines"]}
    # Ties compare presets within one variant only.
    ties = {(t["variant"], t["staleness"], t["a"], t["b"]) for t in data["ties"]}
    assert ("minibatches=1", "on-policy", "reinforce", "grpo") in ties
    assert not any(t["variant"] == "minibatches=2" for t in data["ties"])
    assert {f["variant"] for f in data["findings"]} == {"minibatches=1", "minibatches=2"}
    # 2 mini-batches against 1, per preset and staleness, paired by seed.
    contrasts = {
        (c["preset"], c["staleness"]): (c["value"], c["state"], c["n_seeds"]) for c in data["contrasts"]
    }
    assert contrasts == {
        ("reinforce", "on-policy"): (0.0, "within δ", 5),
        ("reinforce", "sync_offset=2"): (0.0, "within δ", 5),
        ("grpo", "on-policy"): (pytest.approx(-0.05), "lower", 5),
        ("grpo", "sync_offset=2"): (pytest.approx(-0.05), "lower", 5),
    }
    assert {(c["field"], c["field_value"], c["reference"]) for c in data["contrasts"]} == {
        ("optimizer.minibatches", 2, 1)
    }


@pytest.mark.django_db
def test_three_seed_pairs_cannot_tell_however_alike_they_look(alice_client, team, alice):
    """Three pairs' min–max share a sign by chance one time in four: no CI, so no "higher" or
    "lower" (nor "within δ") below 5 pairs, as the rest of the page says."""
    data = payload(alice_client, finished(team, alice, seeds=(0, 1, 2)))
    states = {
        (c["preset"], c["staleness"]): (c["state"], c["n_seeds"], c["interval"]) for c in data["contrasts"]
    }
    assert states == {
        key: ("cannot tell (3 seed pairs: no CI below 5)", 3, "min–max")
        for key in [(p, s) for p in ("reinforce", "grpo") for s in ("on-policy", "sync_offset=2")]
    }


@pytest.mark.django_db
def test_the_summary_csv_has_a_column_per_varied_field(alice_client, experiment):
    response = alice_client.get(
        reverse("experiment-compare-summary", args=[experiment.pk]),
        {"metric": "eval/accuracy", "format": "csv"},
    )
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert {(r["preset"], r["optimizer.minibatches"], r["staleness"]) for r in rows} == {
        (p, m, s) for p in ("reinforce", "grpo") for m in ("1", "2") for s in ("on-policy", "sync_offset=2")
    }


@pytest.mark.django_db(transaction=True)
def test_the_page_splits_panels_and_colours_by_a_varied_field(page, live_server, experiment):
    page.goto(live_server.url + reverse("experiment-compare", args=[experiment.pk]))
    page.wait_for_function("() => document.getElementById('compare').dataset.rendered")
    panels = page.evaluate(
        "() => [...document.querySelectorAll('#plots .panel')].map(p => p.dataset.staleness)"
    )
    assert panels == ["on-policy", "sync_offset=2"]
    page.select_option("select[name=facet]", "optimizer.minibatches")
    page.select_option("select[name=colour]", "staleness")
    page.wait_for_function(
        "() => new URLSearchParams(document.getElementById('compare').dataset.rendered).get('colour') === 'staleness'"
    )
    drawn = page.evaluate(
        """() => [...document.querySelectorAll('#plots .panel')].map(p => ({
            facet: p.dataset.facet,
            means: p.data.filter(t => t.meta.kind === 'mean').map(t => [t.name, t.line.color]),
        }))"""
    )
    assert [p["facet"] for p in drawn] == ["1", "2"]
    for panel in drawn:
        names = sorted(name for name, _ in panel["means"])
        assert names == sorted(
            f"{p} · {s}" for p in ("reinforce", "grpo") for s in ("on-policy", "sync_offset=2")
        )
        colours = {name.split(" · ")[1]: colour for name, colour in panel["means"]}
        assert len(set(colours.values())) == 2, "one colour per staleness setting"
    assert "facet=optimizer.minibatches" in page.url
    rows = page.eval_on_selector_all("#contrasts tr", "rows => rows.map(r => r.textContent)")
    assert len(rows) == 1 + 4 and any("grpo" in r and "lower" in r for r in rows[1:])
    (TEST_VAR / "screenshots").mkdir(parents=True, exist_ok=True)
    page.screenshot(path=TEST_VAR / "screenshots" / "compare-variants.png", full_page=True)
    # The URL reproduces the view.
    page.goto(page.url)
    page.wait_for_function("() => document.getElementById('compare').dataset.rendered")
    assert page.evaluate(
        "() => [...document.querySelectorAll('#plots .panel')].map(p => p.dataset.facet)"
    ) == ["1", "2"]


@pytest.mark.django_db
def test_a_contrast_whose_runs_are_still_going_says_it_is_provisional(alice_client, experiment):
    from experiments.models import Run

    run = experiment.runs.get(
        preset="grpo", staleness="on-policy", seed=2, variant_pairs=[["optimizer.minibatches", 2]]
    )
    Run.objects.filter(pk=run.pk).update(status=Run.RUNNING)
    contrasts = {
        (c["preset"], c["staleness"]): c["state"] for c in payload(alice_client, experiment)["contrasts"]
    }
    assert contrasts[("grpo", "on-policy")].endswith("(provisional: runs still going)")
    assert contrasts[("reinforce", "on-policy")] == "within δ"
