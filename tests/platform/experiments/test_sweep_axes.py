"""A sweep over any config field besides presets, staleness and seeds (`axes`): each combination a
cell, in the API and the form; bad axes and out-of-range knobs are a 422 naming the field, with
nothing queued."""

from __future__ import annotations

import pytest
from django.urls import reverse
from support import TINY_CONFIG, sweep_form

from experiments.forms import parse_axes
from experiments.models import Experiment, Run
from experiments.sweeps import SweepError, expand

pytestmark = pytest.mark.django_db


# A sweep of 3 steps, 2 prompts × 2 responses a step, 4 held-out problems, as the form posts it.
SMALL_FORM = {"steps": "3", "rollout.prompts_per_step": "2", "rollout.group_size": "2", "eval_size": "4"}


def submit(client, token, **sweep):
    body = {"name": "axes", "team": "team-a", "config": TINY_CONFIG, "presets": ["grpo-tis"], **sweep}
    return client.post(
        "/api/sweeps", body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )


def test_every_combination_of_the_axes_is_a_cell_with_its_variant(client, token):
    axes = {"optimizer.minibatches": [1, 2], "rollout.dtype": ["same", "bfloat16"]}
    response = submit(client, token, staleness=[{}, {"sync_offset": 2}], seeds=[0, 1], axes=axes)
    assert response.status_code == 201, response.json()
    experiment = Experiment.objects.get(pk=response.json()["experiment"])
    runs = list(experiment.runs.order_by("pk"))
    assert len(runs) == 2 * 2 * 2 * 2
    assert experiment.spec["axes"] == axes
    seen = {
        (r.staleness, r.config["optimizer"]["minibatches"], r.config["rollout"]["dtype"], r.seed)
        for r in runs
    }
    assert len(seen) == 16
    for run in runs:
        assert run.variant == {
            "optimizer.minibatches": run.config["optimizer"]["minibatches"],
            "rollout.dtype": run.config["rollout"]["dtype"],
        }
    assert runs[2].variant_label == "minibatches=1, dtype=bfloat16"
    assert runs[2].line == "grpo-tis · minibatches=1, dtype=bfloat16"
    api_run = client.get(f"/api/runs/{runs[2].pk}", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert api_run["variant"] == runs[2].variant


def test_a_knob_axis_varies_the_resolved_knob():
    sweep = expand(
        TINY_CONFIG,
        ["grpo-tis", "cispo"],
        [{}],
        [0],
        axes={"algorithm.params.anchor": ["behaviour", "proximal"]},
    )
    anchors = [(c.algorithm.preset, c.algorithm.params["anchor"]) for c in sweep.configs]
    assert anchors == [
        ("grpo-tis", "behaviour"),
        ("grpo-tis", "proximal"),
        ("cispo", "behaviour"),
        ("cispo", "proximal"),
    ]


@pytest.mark.parametrize(
    ("axes", "field", "rule"),
    [
        ({"algorithm.preset": ["grpo"]}, "axes.algorithm.preset", "vary it through presets"),
        ({"seed": [1, 2]}, "axes.seed", "vary it through seeds"),
        ({"staleness.sync_offset": [1, 2]}, "axes.staleness.sync_offset", "vary it through staleness"),
        ({"optimizer.minibatchez": [1, 2]}, "axes.optimizer.minibatchez", "Extra inputs are not permitted"),
        (
            {"optimizer.minibatches": [1, 9]},
            "axes.optimizer.minibatches",
            "must be <= rollout.prompts_per_step",
        ),
        ({"optimizer.epochs": [1, 99]}, "axes.optimizer.epochs", "less than or equal to 8"),
        ({"rollout.dtype": ["same", "float8"]}, "axes.rollout.dtype", "'same', 'bfloat16' or 'float16'"),
        ({"optimizer.minibatches": [1, 1]}, "axes.optimizer.minibatches", "listed twice"),
        ({"optimizer.minibatches": []}, "axes.optimizer.minibatches", "at least one value"),
        (
            {"algorithm.params.m2po_tau": [0.01, 0.1]},
            "axes.algorithm.params.m2po_tau",
            "not a knob of grpo-tis",
        ),
        ({"algorithm.params.is_cap": [0.5, 2]}, "axes.algorithm.params.is_cap", "is_cap must be >= 1"),
        (
            {"algorithm.params.anchor": ["behaviour", "trainer"]},
            "axes.algorithm.params.anchor",
            "anchor must be one of",
        ),
    ],
)
def test_bad_axes_are_a_422_naming_the_field_and_queue_nothing(client, token, axes, field, rule):
    before = Run.objects.count()
    response = submit(client, token, axes=axes)
    assert response.status_code == 422
    errors = {(d["field"], d["msg"]) for d in response.json()["detail"]}
    assert any(loc == field and rule in msg for loc, msg in errors), errors
    assert Run.objects.count() == before


@pytest.mark.parametrize(
    ("params", "field", "rule"),
    [
        ({"is_cap": 0.5}, "algorithm.params.is_cap", "is_cap must be >= 1"),
        ({"dppo_delta": 1.5}, "algorithm.params.dppo_delta", "0 < dppo_delta < 1"),
        ({"sapo_tau_pos": 0}, "algorithm.params.sapo_tau_pos", "sapo_tau_pos must be > 0"),
        ({"bapo_high_step": 0}, "algorithm.params.bapo_high_step", "bapo_high_step must be >= 0.01"),
    ],
)
def test_knobs_out_of_range_are_a_422_naming_the_field(client, token, params, field, rule):
    presets = {
        "is_cap": "grpo-tis",
        "dppo_delta": "dppo-tv",
        "sapo_tau_pos": "sapo",
        "bapo_high_step": "bapo",
    }
    config = {**TINY_CONFIG, "algorithm": {"params": params}}
    response = submit(client, token, config=config, presets=[presets[next(iter(params))]])
    assert response.status_code == 422
    assert any(d["field"] == f"config.{field}" and rule in d["msg"] for d in response.json()["detail"]), (
        response.json()
    )


def test_minibatches_beyond_the_prompt_groups_are_refused_by_the_api(client, token):
    config = {**TINY_CONFIG, "optimizer": {"minibatches": 99}}
    response = submit(client, token, config=config)
    assert response.status_code == 422
    assert any(d["field"] == "config.optimizer.minibatches" for d in response.json()["detail"]), (
        response.json()
    )


def test_the_form_parses_other_axes():
    assert parse_axes(
        "optimizer.minibatches: 1, 4\n\nrollout.dtype: same, bfloat16\nalgorithm.params.opsm_delta: null, 0.1"
    ) == {
        "optimizer.minibatches": [1, 4],
        "rollout.dtype": ["same", "bfloat16"],
        "algorithm.params.opsm_delta": [None, 0.1],
    }


def test_the_form_submits_other_axes_and_names_their_errors(alice_client, team):
    from experiments.forms import TEMPLATES
    from rlcore.presets import PRESETS

    url = reverse("submit-sweep")
    page = alice_client.get(url, {"template": "field-losses"})
    assert page.status_code == 200 and "The field&#x27;s losses under staleness" in page.content.decode()
    assert "Behaviour corrections (proximal anchor)" in page.content.decode()
    assert TEMPLATES["field-losses"]["optimizer.minibatches"] == 4
    # The template runs the field's losses, the newest (ALGORITHMS §16) among them, beside grpo.
    newest = {"icepop", "kpop", "trm", "dppo-kl", "ce-gppo", "dro", "bapo"}
    assert {"grpo", *newest} <= set(TEMPLATES["field-losses"]["presets"]) <= set(PRESETS)
    form = sweep_form(
        team,
        "axes by form",
        presets=["grpo-tis"],
        fields={**SMALL_FORM, "axes": "optimizer.minibatches: 1, 2\nrollout.dtype: same, bfloat16"},
    )
    response = alice_client.post(url, form)
    assert response.status_code == 302, response.content.decode()[:2000]
    experiment = Experiment.objects.get(name="axes by form")
    assert sorted(r.variant_label for r in experiment.runs.all()) == [
        "minibatches=1, dtype=bfloat16",
        "minibatches=1, dtype=same",
        "minibatches=2, dtype=bfloat16",
        "minibatches=2, dtype=same",
    ]
    before = Run.objects.count()
    bad = alice_client.post(url, {**form, "name": "bad axes", "axes": "optimizer.minibatches: 1, 3"})
    assert bad.status_code == 422
    text = bad.content.decode()
    assert "minibatches = 3" in text and "must be &lt;= rollout.prompts_per_step" in text
    unparsed = alice_client.post(url, {**form, "name": "bad axes", "axes": "optimizer.minibatches 1 2"})
    assert "write a config field, a colon and its values" in unparsed.content.decode()
    assert Run.objects.count() == before


def test_expand_reports_every_bad_axis_at_once():
    with pytest.raises(SweepError) as caught:
        expand(TINY_CONFIG, ["grpo"], [{}], [0], axes={"seed": [1], "optimizer.minibatches": [1, 1]})
    assert {name for name, _ in caught.value.errors} == {"axes.seed", "axes.optimizer.minibatches"}


def test_axis_values_that_make_the_same_run_are_refused():
    with pytest.raises(SweepError) as caught:
        expand(TINY_CONFIG, ["grpo"], [{}], [0], axes={"optimizer.minibatches": [2, "2"]})
    assert (
        "axes.optimizer.minibatches",
        "optimizer.minibatches = 2 and optimizer.minibatches = '2' make the same run; list each value once",
    ) in caught.value.errors


def test_a_knob_axis_is_checked_against_the_presets_with_the_base_configs_overrides():
    base = {**TINY_CONFIG, "algorithm": {"params": {"std_normalize": True}}}
    sweep = expand(base, ["reinforce"], [{}], [0], axes={"algorithm.params.std": ["sample", "population"]})
    assert [c.algorithm.params["std"] for c in sweep.configs] == ["sample", "population"]


def test_axis_errors_come_with_the_rest_of_the_grids(client, token):
    response = submit(client, token, seeds=[0, 0], axes={"seed": [1]})
    fields = {d["field"] for d in response.json()["detail"]}
    assert {"seeds", "axes.seed"} <= fields


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [
        ("algorithm.params.is_cap", "0.5", "is_cap must be &gt;= 1"),
        ("algorithm.params.m2po_tau", "0", "m2po_tau must be &gt; 0"),
        ("algorithm.params.dppo_delta", "1.5", "0 &lt; dppo_delta &lt; 1"),
        ("optimizer.epochs", "9", "less than or equal to 8"),
        ("optimizer.minibatches", "3", "must be &lt;= rollout.prompts_per_step (2)"),
    ],
)
def test_the_form_names_knobs_and_optimiser_settings_out_of_range(alice_client, team, field, value, rule):
    form = sweep_form(
        team,
        "out of range",
        presets=["grpo-tis"],
        fields={**SMALL_FORM, field: value},
    )
    response = alice_client.post(reverse("submit-sweep"), form)
    assert response.status_code == 422
    assert rule in response.content.decode()
    assert not Experiment.objects.filter(name="out of range").exists()
