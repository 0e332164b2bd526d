"""`dashboards.claims.verdicts` on constructed final values whose answer is known: each kind's clear support,
clear contradiction and too few seeds, the TOST, Holm across settings, paired and unpaired tests
(checked against scipy's own t tests), missing and waited-for cells, and how settings combine."""

import numpy as np
import pytest
from scipy import stats

from dashboards.claims import verdicts
from dashboards.claims.verdicts import CANNOT_TELL, CONTRADICT, MISSING, SUPPORT, Data, Part, Statement

SEEDS = range(5)
BASE = {s: 0.70 + 0.01 * s for s in SEEDS}  # on-policy: seeds differ, pairing removes that
NOISE = np.array([-0.002, 0.001, 0.0, 0.002, -0.001])


def shifted(by, noise=NOISE, base=BASE):
    return {s: base[s] + by + noise[i] for i, s in enumerate(base)}


def verdict(kind, a, b=None, delta=0.02, alpha=0.05, settings=("s",)):
    """One part: X at each of `settings` (values `a`) against X on-policy (`BASE`) or Y (`b`)."""
    finals = {("x", "on-policy"): BASE}
    for s in settings:
        finals[("x", s)] = a
        if b is not None:
            finals[("y", s)] = b
    statement = Statement(
        (Part(kind, "x", "y" if b is not None else ""),), tuple(settings), delta=delta, alpha=alpha
    )
    return verdicts.evaluate(statement, Data(finals))


@pytest.mark.parametrize(
    ("kind", "a", "b", "expected"),
    [
        ("holds", shifted(-0.005), None, SUPPORT),
        ("holds", shifted(-0.10), None, CONTRADICT),
        ("degrades", shifted(-0.10), None, SUPPORT),
        ("degrades", shifted(-0.005), None, CONTRADICT),
        ("beats", shifted(0.05), BASE, SUPPORT),
        ("beats", shifted(0.0), BASE, CONTRADICT),
        ("equivalent", shifted(0.005), BASE, SUPPORT),
        ("equivalent", shifted(0.10), BASE, CONTRADICT),
        ("equivalent", shifted(-0.10), BASE, CONTRADICT),
    ],
)
def test_each_kind_supports_and_contradicts_where_the_answer_is_clear(kind, a, b, expected):
    result = verdict(kind, a, b)
    assert result["verdict"] == expected, result
    (row,) = result["by_setting"][0]["parts"]
    assert row["paired"] and row["n"] == 5 and row["test"] == "paired t"


@pytest.mark.parametrize("kind", verdicts.KINDS)
def test_too_few_seeds_cannot_tell(kind):
    one = verdict(kind, {0: 0.5}, {0: 0.5} if kind in verdicts.NEEDS_Y else None)
    assert one["verdict"] == CANNOT_TELL and "one seed" in one["by_setting"][0]["parts"][0]["reason"]
    # Two seeds that disagree: the t interval over 1 degree of freedom is wide, and more seeds would settle it.
    noisy = {0: BASE[0] - 0.03, 1: BASE[1] + 0.01}
    two = verdict(kind, noisy, {0: BASE[0], 1: BASE[1]} if kind in verdicts.NEEDS_Y else None)
    (row,) = two["by_setting"][0]["parts"]
    assert two["verdict"] == CANNOT_TELL and row["n"] == 2
    assert row["lo"] < -0.02 < row["hi"] or row["lo"] < 0.02 < row["hi"]


def test_seeds_needed_is_the_smallest_n_whose_t_test_has_the_power():
    # D = −0.01 ± σ 0.02 against holds' −δ = −0.02: a gap of 0.01 over σ_d 0.02.
    a = {s: BASE[s] - 0.01 + e for s, e in zip(range(3), (-0.02, 0.0, 0.02), strict=True)}
    (row,) = verdict("holds", a)["by_setting"][0]["parts"]
    n = row["seeds_needed"]
    power = lambda k: 0.01 / (0.02 / np.sqrt(k)) - (stats.t.ppf(0.95, k - 1) + stats.t.ppf(0.8, k - 1))  # noqa: E731
    assert power(n) >= 0 > power(n - 1)


@pytest.mark.parametrize(
    ("kind", "by", "threshold"),
    [("holds", -0.01, -0.02), ("degrades", -0.01, -0.02), ("beats", 0.01, 0.02), ("equivalent", 0.015, 0.02)],
)
def test_an_undecided_test_names_the_line_its_seeds_figure_tells_d_from(kind, by, threshold):
    """Not 0, as "cannot be told apart" asks, but the ±δ the claim states: the two figures differ
    for the same pair, and the reason says which line this one is about."""
    a = {s: BASE[s] + by + e for s, e in zip(range(3), (-0.02, 0.0, 0.02), strict=True)}
    (row,) = verdict(kind, a, BASE if kind in verdicts.NEEDS_Y else None)["by_setting"][0]["parts"]
    assert row["verdict"] == CANNOT_TELL and row["seeds_needed"] > 3, row
    assert row["seeds_threshold"] == threshold
    assert row["reason"].endswith(
        f"cannot tell (about {row['seeds_needed']} seeds per cell would settle it: D = {row['estimate']:+g} "
        f"is to be told from {threshold:+g}, one-sided)"
    ), row["reason"]
    assert verdicts.nearest_threshold("equivalent", -0.015, 0.02) == -0.02


def test_the_tost_is_two_one_sided_t_tests_and_the_interval_is_90_percent():
    a = shifted(0.008, noise=np.array([-0.01, 0.004, 0.0, 0.01, -0.004]))
    result = verdict("equivalent", a, BASE)
    (row,) = result["by_setting"][0]["parts"]
    d = np.array([a[s] - BASE[s] for s in SEEDS])
    lower = stats.ttest_1samp(d, -0.02, alternative="greater").pvalue
    upper = stats.ttest_1samp(d, 0.02, alternative="less").pvalue
    assert row["p_support"] == pytest.approx(max(lower, upper), rel=1e-9)
    ci = stats.t.interval(0.90, 4, loc=d.mean(), scale=stats.sem(d))
    assert (row["lo"], row["hi"]) == (round(ci[0], 3), round(ci[1], 3))
    assert result["confidence"] == pytest.approx(0.90)
    assert result["verdict"] == SUPPORT, "both one-sided tests reject at 5%"
    # The same mean with twice the spread: the upper test no longer rejects.
    wide = verdict("equivalent", shifted(0.008, noise=2 * np.array([-0.01, 0.004, 0.0, 0.01, -0.004])), BASE)
    assert wide["verdict"] == CANNOT_TELL


def test_holm_adjusts_across_settings():
    assert verdicts.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert verdicts.holm([]) == []
    # A drop whose one-sided p is about 0.024 supports "holds" at one setting ...
    a = {s: BASE[s] - 0.0002 + e for s, e in zip(SEEDS, (-0.02, -0.01, 0.0, 0.01, 0.02), strict=True)}
    one = verdict("holds", a)
    (row,) = one["by_setting"][0]["parts"]
    assert 0.02 < row["p_support"] < 0.03 and one["verdict"] == SUPPORT and not one["holm"]
    # ... but not at three settings alike: Holm multiplies the smallest by 3.
    three = verdict("holds", a, settings=("s1", "s2", "s3"))
    assert three["holm"] and three["tests"] == 3 and three["verdict"] == CANNOT_TELL
    assert [p["p_support_holm"] for e in three["by_setting"] for p in e["parts"]] == pytest.approx(
        [3 * row["p_support"]] * 3
    )


def test_seeds_in_common_are_paired_and_otherwise_welch():
    x = {0: 0.71, 1: 0.74, 2: 0.69}
    y = {10: 0.60, 11: 0.66, 12: 0.62, 13: 0.61}
    result = verdict("beats", x, y)
    (row,) = result["by_setting"][0]["parts"]
    assert not row["paired"] and row["test"].startswith("Welch")
    welch = stats.ttest_ind(list(x.values()), list(y.values()), equal_var=False, alternative="greater")
    shifted_x = [v - 0.02 for v in x.values()]  # H0: X − Y ≤ δ
    expected = stats.ttest_ind(shifted_x, list(y.values()), equal_var=False, alternative="greater").pvalue
    assert row["p_support"] == pytest.approx(expected, rel=1e-9) and welch.pvalue < expected


def test_a_change_of_exactly_delta_with_no_spread_is_within_delta():
    a = {s: BASE[s] - 0.02 for s in SEEDS}  # floating point makes some −0.020000000000000018
    assert verdict("holds", a)["verdict"] == SUPPORT
    assert verdict("degrades", a)["verdict"] == CONTRADICT
    assert verdict("equivalent", a, BASE)["verdict"] == SUPPORT
    assert verdict("beats", {s: BASE[s] + 0.02 for s in SEEDS}, BASE)["verdict"] == CONTRADICT


def test_cells_without_runs_are_missing_and_cells_still_running_are_waited_for():
    statement = Statement((Part("holds", "x"),), ("s",))
    missing = verdicts.evaluate(statement, Data({("x", "on-policy"): BASE}))
    assert missing["verdict"] == MISSING and missing["missing"] == ["x × s"]
    waiting = verdicts.evaluate(statement, Data({("x", "on-policy"): BASE}, runs={("x", "s"): (2, 5)}))
    assert waiting["verdict"] == CANNOT_TELL and waiting["waiting"] == ["x × s"] and not waiting["missing"]


def test_every_needs_each_setting_and_some_needs_one():
    finals = {("x", "on-policy"): BASE, ("x", "a"): shifted(-0.005), ("x", "b"): shifted(-0.1)}
    every = verdicts.evaluate(Statement((Part("holds", "x"),), ("a", "b"), "every"), Data(finals))
    some = verdicts.evaluate(Statement((Part("holds", "x"),), ("a", "b"), "some"), Data(finals))
    assert [e["verdict"] for e in every["by_setting"]] == [SUPPORT, CONTRADICT]
    assert (every["verdict"], some["verdict"]) == (CONTRADICT, SUPPORT)
    # Parts are a conjunction at each setting: one part contradicted contradicts the setting.
    both = Statement((Part("holds", "x"), Part("degrades", "x")), ("a",))
    assert verdicts.evaluate(both, Data(finals))["by_setting"][0]["verdict"] == CONTRADICT
