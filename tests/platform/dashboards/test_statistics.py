"""`dashboards.comparison.statistics` against rliable 1.2 (tests/platform/dashboards/rliable/fixture.json, made by
make_fixture.py there): the same IQM, CIs, probability of improvement and performance profiles,
the bootstrap drawn in rliable's order from the same seed."""

import json
from pathlib import Path

import numpy as np
import pytest
from dashboard_helpers import NOIS_OFFLINE, data
from sample_experiments import make_finished_experiment

from dashboards.comparison import panels, statistics

FIXTURE = json.loads((Path(__file__).parent / "rliable" / "fixture.json").read_text())
INPUTS = {name: np.array(v) for name, v in FIXTURE["inputs"].items()}
SEED, REPS = FIXTURE["seed"], FIXTURE["reps"]


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_iqm_and_its_ci_are_rliables(name):
    expected = FIXTURE["iqm"][name]
    got = statistics.interval_iqm(INPUTS[name], reps=REPS, seed=SEED)
    assert got.value == pytest.approx(expected["value"], abs=1e-12)
    assert (got.lo, got.hi) == pytest.approx((expected["lo"], expected["hi"]), abs=1e-12)
    assert statistics.iqm(INPUTS[name]) == pytest.approx(expected["value"], abs=1e-12)


@pytest.mark.parametrize("pair", FIXTURE["poi"], ids=lambda p: f"{p['x']}>{p['y']}")
def test_probability_of_improvement_and_its_ci_are_rliables(pair):
    x, y = INPUTS[pair["x"]], INPUTS[pair["y"]]
    got = statistics.interval_poi(x, y, reps=REPS, seed=SEED)
    assert got.value == pytest.approx(pair["value"], abs=1e-12)
    assert (got.lo, got.hi) == pytest.approx((pair["lo"], pair["hi"]), abs=1e-12)


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_performance_profiles_and_their_cis_are_rliables(name):
    expected = FIXTURE["profile"][name]
    values, lo, hi = statistics.interval_profile(INPUTS[name], FIXTURE["taus"], reps=REPS, seed=SEED)
    np.testing.assert_allclose(values, expected["value"], atol=1e-12)
    np.testing.assert_allclose(lo, expected["lo"], atol=1e-12)
    np.testing.assert_allclose(hi, expected["hi"], atol=1e-12)


def test_the_draws_do_not_depend_on_how_they_are_chunked(monkeypatch):
    scores = INPUTS["six_seeds_three_tasks"]
    whole = statistics.interval_iqm(scores, reps=500, seed=3)
    monkeypatch.setattr(statistics, "_CHUNK", 37)
    statistics.fresh_draws.cache_clear()  # drawn again, in chunks of 37
    try:
        assert statistics.interval_iqm(scores, reps=500, seed=3) == whole
    finally:
        statistics.fresh_draws.cache_clear()


@pytest.mark.parametrize("shape", [(1, 1), (3, 1), (10, 1), (6, 3)])
def test_a_profile_from_draw_counts_is_the_mean_over_the_resampled_scores_to_the_bit(shape):
    scores = np.random.default_rng(7).normal(size=shape).round(1)  # ties between runs too
    taus = np.linspace(scores.min() - 0.1, scores.max(), 13)
    index = statistics._draws(np.random.RandomState(5), shape[0], shape, 300)
    resampled = statistics._resample(scores, index).reshape(300, -1)
    shares = (resampled[:, None, :] > taus[None, :, None]).mean(axis=2)
    lo, hi = np.percentile(shares, [2.5, 97.5], axis=0)
    _, got_lo, got_hi = statistics.interval_profile(scores, taus, reps=300, seed=5)
    assert got_lo.tolist() == lo.tolist() and got_hi.tolist() == hi.tolist()
    assert not statistics.fresh_draws(5, shape[0], shape, 300).flags.writeable, "a shared table"


def test_iqm_trims_a_quarter_from_each_end_and_names_its_method():
    # 8 scores: drop the 2 lowest and 2 highest, average 3, 4, 5, 6.
    assert statistics.iqm([1, 2, 3, 4, 5, 6, 7, 100]) == 4.5
    record = statistics.interval_iqm([0.5, 0.6, 0.7], reps=100, seed=0).record()
    assert record["method"] == "stratified percentile bootstrap"
    assert (record["reps"], record["seed"], record["n"], record["confidence"]) == (100, 0, 3, 0.95)


def test_paired_probability_of_improvement_counts_seeds_won_and_ties_half():
    x = [0.7, 0.6, 0.5, 0.5]
    y = [0.6, 0.6, 0.6, 0.4]
    got = statistics.interval_paired_poi(x, y, reps=1000, seed=0)
    assert got.value == pytest.approx((1 + 0.5 + 0 + 1) / 4)
    assert 0 <= got.lo <= got.value <= got.hi <= 1
    same = statistics.interval_paired_poi(x, x, reps=100, seed=0)
    assert (same.value, same.lo, same.hi) == (0.5, 0.5, 0.5)


def test_a_profile_counts_scores_strictly_above_tau():
    assert statistics.profile([0.2, 0.5, 0.5, 0.9], [0.0, 0.5, 0.9]).tolist() == [1.0, 0.25, 0.0]


def test_bad_scores_are_refused_with_the_rule():
    with pytest.raises(ValueError, match="finite"):
        statistics.iqm([0.5, float("nan")])
    with pytest.raises(ValueError, match="at least one run"):
        statistics.iqm([])
    with pytest.raises(ValueError, match="same tasks"):
        statistics.probability_of_improvement(np.zeros((3, 2)), np.zeros((3, 1)))


def test_the_comparison_gives_each_cells_iqm_p_of_improvement_and_profiles(alice_client, demo):
    payload = data(alice_client, demo, metric="eval/accuracy")
    panel = payload["statistics"]
    cells = {(c["line"], c["staleness"]): c for c in panel["cells"]}
    nois = cells[("rec-oneside-nois", "offline")]
    finals = [0.60 + NOIS_OFFLINE[s] + 0.02 * s for s in range(3)]
    assert nois["iqm"]["value"] == pytest.approx(statistics.iqm(finals))
    assert nois["few_seeds"] and nois["n"] == 3
    expected = statistics.interval_iqm(finals, reps=statistics.PAGE_REPS).record()
    assert nois["iqm"] == expected, "the recorded method, reps and seed"
    assert (nois["iqm"]["method"], nois["iqm"]["reps"], nois["iqm"]["seed"]) == (
        "stratified percentile bootstrap",
        10_000,
        0,
    )
    assert nois["mean"] == statistics.interval_mean(finals, reps=statistics.PAGE_REPS).record()
    poi = {(r["a"], r["b"], r["staleness"]): r for r in panel["improvement"]}
    wide = poi[("rec-oneside-nois", "rec-oneside-nois-wide", "offline")]
    assert wide["paired"] and wide["poi"]["value"] == 0.0, "wide beats nois at every seed offline"
    tie = poi[("reinforce", "grpo", "on-policy")]
    assert (tie["poi"]["value"], tie["poi"]["lo"], tie["poi"]["hi"]) == (0.5, 0.5, 0.5)
    (offline,) = [p for p in panel["profiles"] if p["staleness"] == "offline"]
    assert len(offline["taus"]) == statistics.PROFILE_POINTS and offline["taus"][0] == pytest.approx(0.40)
    reinforce = next(line for line in offline["lines"] if line["line"] == "reinforce")
    assert reinforce["value"][0] == pytest.approx(2 / 3), "above the lowest score: 2 of its 3 seeds"
    assert reinforce["value"][-1] == 0.0


def test_cells_with_other_seeds_get_an_unpaired_p_of_improvement(alice_client, team, alice):
    experiment = make_finished_experiment(
        team, alice, presets=("reinforce", "grpo"), staleness=({},), seeds=(0, 1, 2)
    )
    experiment.runs.filter(preset="grpo", seed=2).delete()
    panel = data(alice_client, experiment)["statistics"]
    (row,) = panel["improvement"]
    assert not row["paired"] and row["poi"]["n"] == 2


def test_the_cached_panel_is_the_panel_of_the_same_inputs_and_follows_a_new_value():
    lines = [{"experiment": 1, "key": k, "line": k, "variant_label": ""} for k in ("grpo", "reinforce")]
    finals = {
        (1, "grpo", "on-policy"): {0: 0.70, 1: 0.72, 2: 0.74},
        (1, "reinforce", "on-policy"): {0: 0.60, 1: 0.65, 2: 0.61},
    }
    before = statistics.panel(finals, lines, ["on-policy"])
    first = panels.kept_statistics(finals, lines, ["on-policy"])
    assert first == before
    first["cells"].clear()  # what a caller does with its copy never reaches the next one
    assert panels.kept_statistics(finals, lines, ["on-policy"]) == statistics.panel(
        finals, lines, ["on-policy"]
    )
    finals[(1, "reinforce", "on-policy")][2] = 0.66  # a run logged a new final value
    moved = panels.kept_statistics(finals, lines, ["on-policy"])
    assert moved == statistics.panel(finals, lines, ["on-policy"]) != before
    assert moved["cells"][1]["iqm"]["value"] == pytest.approx((0.65 + 0.66 + 0.60) / 3)
