"""Seed aggregation for the dashboards: interpolation on a common grid, bands, the bootstrap CI
with its fixed seed, spike-preserving downsampling and the final-value rules, checked on numbers
worked out by hand."""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import pytest

from dashboards.comparison import curves
from dashboards.comparison.curves import Series


def test_seeds_logged_at_different_steps_are_interpolated_on_the_union_of_their_steps():
    a = Series.of([0, 2, 4], [0.0, 2.0, 4.0])
    b = Series.of([0, 1, 4], [1.0, 1.0, 1.0])
    curve = curves.aggregate([a, b], "none")
    assert curve.x.tolist() == [0, 1, 2, 4]
    assert curve.mean.tolist() == [0.5, 1.0, 1.5, 2.5]
    assert curve.n.tolist() == [2, 2, 2, 2]
    assert curve.lo is None and curve.hi is None


def test_a_seed_still_running_counts_only_where_it_has_points():
    done = Series.of([0, 1, 2, 3], [0.0, 1.0, 2.0, 3.0])
    running = Series.of([0, 1], [2.0, 3.0])
    curve = curves.aggregate([done, running], "minmax")
    assert curve.n.tolist() == [2, 2, 1, 1]
    assert curve.mean.tolist() == [1.0, 2.0, 2.0, 3.0]
    assert curve.lo.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert curve.hi.tolist() == [2.0, 3.0, 2.0, 3.0]


def test_missing_values_are_dropped_and_points_sorted():
    s = Series.of([3, 1, 2, 0], [3.0, None, float("nan"), 0.0])
    assert s.x.tolist() == [0, 3] and s.y.tolist() == [0.0, 3.0]
    assert curves.aggregate([s], "none", grid=np.array([0.0, 1.5, 3.0])).mean.tolist() == [0.0, 1.5, 3.0]


def test_std_band_is_the_sample_std_and_one_seed_has_no_width():
    seeds = [Series.of([0, 1], [v, v + 1]) for v in (1.0, 2.0, 3.0)]
    curve = curves.aggregate(seeds, "std")
    assert curve.mean.tolist() == [2.0, 3.0]
    assert curve.lo.tolist() == [1.0, 2.0] and curve.hi.tolist() == [3.0, 4.0]
    single = curves.aggregate(seeds[:1], "std")
    assert single.lo.tolist() == single.hi.tolist() == [1.0, 2.0]


def test_bootstrap_ci_is_reproducible_and_brackets_the_mean():
    values = np.array([[1.0, 10.0], [2.0, 10.0], [3.0, 10.0], [6.0, 10.0]])
    lo, hi = curves.bootstrap_ci(values)
    lo_again, hi_again = curves.bootstrap_ci(values)
    assert lo.tolist() == lo_again.tolist() and hi.tolist() == hi_again.tolist()
    # The 2.5% and 97.5% quantiles of 1,000 resampled means of {1, 2, 3, 6} with seed 0:
    assert (lo[0], hi[0]) == (1.5, 5.0)
    assert lo[1] == hi[1] == 10.0, "seeds that agree have a CI of zero width"
    _, other_hi = curves.bootstrap_ci(values, seed=1)
    assert other_hi[0] == pytest.approx(5.00625), "another seed draws other resamples"


def test_percentiles_of_columns_with_and_without_gaps_are_numpys_nanpercentile_to_the_bit():
    rng = np.random.default_rng(3)
    q = [2.5000000000000022, 97.5]
    for rows, columns in [(1, 1), (2, 7), (1000, 40), (37, 300)]:
        values = rng.normal(size=(rows, columns)).round(int(rng.integers(0, 3)))
        values[rng.random(values.shape) < 0.1] = -0.0
        for gaps in (0.0, 0.3):
            holed = np.where(rng.random(values.shape) < gaps, np.nan, values)
            holed[:, 0] = np.nan if gaps else holed[:, 0]  # a column with no value at all
            with np.errstate(all="ignore"), pytest.warns(RuntimeWarning) if gaps else nullcontext():
                expected = np.nanpercentile(holed, q, axis=0)
                got = curves.nan_percentile_columns(holed, q)
            assert (
                np.array_equal(got, expected, equal_nan=True)
                and (np.signbit(got) == np.signbit(expected)).all()
            ), (rows, columns, gaps)


def test_ci_band_uses_the_bootstrap_per_grid_point():
    seeds = [Series.of([0, 1], [v, 2 * v]) for v in (1.0, 2.0, 3.0, 6.0)]
    curve = curves.aggregate(seeds, "ci")
    assert curve.mean.tolist() == [3.0, 6.0]
    assert (curve.lo[0], curve.hi[0]) == (1.5, 5.0)
    assert (curve.lo[1], curve.hi[1]) == (3.0, 10.0), "the same resamples at every grid point"


def test_unknown_band_is_refused_by_name():
    with pytest.raises(ValueError, match="band must be one of std, minmax, ci, none"):
        curves.aggregate([], "sem")


def test_downsampling_keeps_a_one_step_spike_and_the_first_and_last_points():
    n = 100_000
    y = np.sin(np.arange(n) / 5000.0)
    y[31_337] = 50.0
    y[77_777] = -50.0
    keep = curves.downsample_index(y)
    assert 31_337 in keep and 77_777 in keep
    assert keep[0] == 0 and keep[-1] == n - 1
    width = -(-n // curves.MAX_BUCKETS)
    assert len(np.unique(keep // width)) <= curves.MAX_BUCKETS
    assert len(keep) <= 3 * curves.MAX_BUCKETS + 1
    assert np.all(np.diff(keep) > 0)


def test_downsampling_keeps_short_series_whole_and_buckets_each_min_max_last():
    assert curves.downsample_index(np.arange(5.0)).tolist() == [0, 1, 2, 3, 4]
    y = np.array([5.0, 1.0, 9.0, 2.0, 2.0, 7.0, 3.0, 0.0, 4.0])
    # 3 buckets of 3: [5 1 9] [2 2 7] [3 0 4] → min, max and last of each, and the first point.
    assert curves.downsample_index(y, max_buckets=3).tolist() == [0, 1, 2, 3, 5, 7, 8]


def test_downsampled_curve_keeps_a_spike_of_one_seed_through_the_mean():
    steps = np.arange(2001)
    flat = Series.of(steps, np.zeros(2001))
    spiky_y = np.zeros(2001)
    spiky_y[1234] = 8.0
    curve = curves.downsample(curves.aggregate([flat, Series.of(steps, spiky_y)], "std"), max_buckets=100)
    assert len(curve.x) <= 301
    assert curve.mean.max() == 4.0 and curve.x[curve.mean.argmax()] == 1234
    assert curve.x[0] == 0 and curve.x[-1] == 2000


def test_downsampled_band_keeps_a_spike_the_mean_does_not_show():
    """Two seeds spike in opposite directions at one step: the mean stays flat, the band does not."""
    steps = np.arange(2001)
    up, down = np.zeros(2001), np.zeros(2001)
    up[1234], down[1234] = 8.0, -8.0
    full = curves.aggregate([Series.of(steps, up), Series.of(steps, down)], "minmax")
    curve = curves.downsample(full, max_buckets=100)
    assert len(curve.x) <= 301 and not curve.mean.any()
    assert (curve.lo.min(), curve.hi.max()) == (-8.0, 8.0)
    # Only the spike's bucket of 21 steps (1218…1238) is widened; elsewhere the band is the seeds' 0…0.
    wide = curve.x[curve.hi > 0]
    assert wide.min() >= 1218 and wide.max() <= 1238 and len(wide) >= 1
    # Every kept point's band is its bucket's envelope of the full band: nothing narrower.
    width = 21
    for x, lo, hi in zip(curve.x.astype(int), curve.lo, curve.hi, strict=True):
        bucket = slice(x // width * width, x // width * width + width)
        assert lo == full.lo[bucket].min() and hi == full.hi[bucket].max()


def test_downsampling_a_short_curve_keeps_it_exactly():
    full = curves.aggregate(
        [Series.of([0, 1, 2], [1.0, 2.0, 3.0]), Series.of([0, 1, 2], [3.0, 2.0, 1.0])], "minmax"
    )
    curve = curves.downsample(full)
    assert (
        curve.x.tolist() == [0, 1, 2]
        and curve.lo.tolist() == [1.0, 2.0, 1.0]
        and curve.hi.tolist() == [3.0, 2.0, 3.0]
    )


@pytest.mark.parametrize(
    ("rule", "k", "expected"),
    [("last", 10, 2.0), ("mean_last_k", 2, 3.0), ("mean_last_k", 10, 2.0), ("best", 10, 4.0)],
)
def test_final_value_rules(rule, k, expected):
    series = Series.of([0, 1, 2, 3], [0.0, 2.0, 4.0, 2.0])
    assert curves.final_value(series, rule, k) == expected


def test_area_under_curve_is_normalised_by_the_x_span():
    # Trapezoids over x = 0, 1, 3: (0 + 2) / 2 × 1 + (2 + 4) / 2 × 2 = 7, over a span of 3.
    assert curves.final_value(Series.of([0, 1, 3], [0.0, 2.0, 4.0]), "auc") == pytest.approx(7 / 3)
    assert curves.final_value(Series.of([5], [1.5]), "auc") == 1.5
    assert np.isnan(curves.final_value(Series.of([], []), "last"))
    with pytest.raises(ValueError, match="rule must be one of"):
        curves.final_value(Series.of([0], [1.0]), "median")


def test_summary_across_seeds_has_a_fixed_seed_ci_from_five_seeds_and_says_how_many():
    summary = curves.summarise([1.0, 2.0, 3.0, 6.0, 4.0, float("nan")])
    assert summary.n_seeds == 5 and summary.mean == 3.2 and summary.interval == "95% bootstrap CI"
    assert summary.std == pytest.approx(np.std([1, 2, 3, 6, 4], ddof=1))
    assert (summary.lo, summary.hi) == (pytest.approx(1.8), pytest.approx(4.8))
    assert curves.summarise([1.0, 2.0, 3.0, 6.0, 4.0]) == summary, "a fixed bootstrap seed"
    # Below five seeds a bootstrap is little more than the range (two seeds: exactly the two values).
    four = curves.summarise([1.0, 2.0, 3.0, 6.0])
    assert (four.lo, four.hi, four.interval) == (1.0, 6.0, "min–max")
    one = curves.summarise([0.5])
    assert (one.n_seeds, one.mean, one.std, one.interval) == (1, 0.5, 0.0, None)
    assert np.isnan(one.lo) and np.isnan(one.hi)
    assert curves.summarise([]).n_seeds == 0


def test_x_axes_samples_tokens_and_time():
    steps = np.array([0.0, 1.0, 2.0, 4.0])
    assert curves.samples_x(steps, prompts_per_step=4, group_size=8).tolist() == [0, 32, 64, 128]
    # Mean lengths 10, 20, 30, 40 at steps 1..4 with 32 responses per step: 320, 960, 1920, 3200 cumulative.
    # A length logged at step 0 (before training) is not counted.
    lengths = np.array([99.0, 10.0, 20.0, 30.0, 40.0])
    tokens = curves.tokens_x(steps, np.arange(5.0), lengths, 32)
    assert tokens.tolist() == [0.0, 320.0, 960.0, 3200.0]
    assert np.isnan(curves.tokens_x(steps, np.array([0.0]), np.array([5.0]), 32)).all()
    assert curves.time_x(np.array([100.0, 101.5, 104.0])).tolist() == [0.0, 1.5, 4.0]


def test_a_paired_difference_pairs_seeds_so_a_shared_seed_effect_cancels():
    # Seeds differ by a lot (0.3 to 0.9) but b is 0.1 above a on every shared seed: exactly −0.1.
    a = {0: 0.5, 1: 0.9, 2: 0.3, 4: 0.8, 5: float("nan")}
    b = {0: 0.6, 1: 1.0, 2: 0.4, 3: 0.7, 5: 0.5}
    d = curves.paired_difference(a, b)
    assert d.seeds == [0, 1, 2], "seed 3 and 4 have no partner, seed 5 no value"
    assert (d.mean, d.lo, d.hi) == (pytest.approx(-0.1), pytest.approx(-0.1), pytest.approx(-0.1))
    assert d.std == pytest.approx(0.0, abs=1e-12) and not d.contains_zero()


def test_two_pairs_get_their_min_max_and_five_a_paired_bootstrap_with_a_fixed_seed():
    # Two pairs, differences 0 and 0.2: a bootstrap would only resample means 0, 0.1, 0.2.
    d = curves.paired_difference({0: 0.5, 1: 0.7}, {0: 0.5, 1: 0.5})
    assert (d.mean, d.lo, d.hi, d.interval) == (pytest.approx(0.1), 0.0, pytest.approx(0.2), "min–max")
    assert d.std == pytest.approx(0.2 / 2**0.5) and d.contains_zero()
    five = curves.paired_difference({s: 0.5 + 0.05 * s for s in range(5)}, dict.fromkeys(range(5), 0.5))
    assert five.interval == "95% bootstrap CI" and five.mean == pytest.approx(0.1)
    assert 0 < five.lo < five.mean < five.hi < 0.2
    assert (
        curves.paired_difference({s: 0.5 + 0.05 * s for s in range(5)}, dict.fromkeys(range(5), 0.5)) == five
    )


def test_one_pair_has_no_ci_and_no_pair_no_value():
    one = curves.paired_difference({0: 0.7, 1: 0.2}, {0: 0.5})
    assert one.mean == pytest.approx(0.2) and one.n_pairs == 1 and not one.has_interval
    assert np.isnan(one.lo) and np.isnan(one.std) and one.contains_zero()
    assert np.isnan(curves.paired_difference({0: 0.7}, {1: 0.5}).mean)


def test_seeds_needed_from_the_observed_spread_of_the_difference():
    # Differences 0.01 and 0.03: Δ = 0.02, σ_d = 0.01·√2, ((1.95996 + 0.84162)·0.01414 / 0.02)² = 3.92 → 4.
    d = curves.paired_difference({0: 0.51, 1: 0.53}, {0: 0.5, 1: 0.5})
    assert curves.seeds_needed(d) == 4
    # Ten times the spread for the same Δ: 392.4 → 393.
    wide = curves.paired_difference({0: 0.42, 1: 0.62}, {0: 0.5, 1: 0.5})
    assert wide.mean == pytest.approx(0.02) and curves.seeds_needed(wide) == 393
    assert curves.seeds_needed(curves.paired_difference({0: 0.6, 1: 0.4}, {0: 0.5, 1: 0.5})) is None, "Δ = 0"
    assert curves.seeds_needed(curves.paired_difference({0: 0.6}, {0: 0.5})) is None, "σ unknown"


def _drop(ci_lo: float) -> curves.Difference:
    return curves.Difference(ci_lo + 0.01, ci_lo, ci_lo + 0.02, 0.01, [0, 1])


def test_the_tolerance_is_the_stalest_setting_up_to_which_every_drop_stays_within_delta():
    settings = ["on-policy", "sync_offset=8", "sync_interval=48", "offline"]
    drops = {"sync_offset=8": _drop(-0.015), "sync_interval=48": _drop(-0.019), "offline": _drop(-0.05)}
    assert curves.tolerance(settings, drops, 0.02) == "sync_interval=48"
    assert curves.tolerance(settings, drops, 0.06) == "offline"
    assert curves.tolerance(settings, drops, 0.01) == "on-policy", "tolerates no staleness"
    # A failing setting stops it even if a staler one holds again; a drop without CI cannot hold.
    assert curves.tolerance(
        settings, {**drops, "sync_interval=48": _drop(-0.03), "offline": _drop(0.0)}, 0.02
    ) == ("sync_offset=8")
    one_seed = curves.Difference(0.0, float("nan"), float("nan"), float("nan"), [0])
    assert curves.tolerance(settings, {**drops, "sync_offset=8": one_seed}, 0.02) == "on-policy"
    assert curves.tolerance([], {}, 0.02) is None


def test_decisions_are_made_at_the_precision_shown():
    # 0.535 − 0.555 is −0.020000000000000018 in floating point: shown as −0.020, so within δ = 0.02.
    drop = curves.paired_difference({0: 0.535, 1: 0.535}, {0: 0.555, 1: 0.555})
    assert drop.lo < -0.02 and not curves.holds_within(drop, 0.02)
    shown = drop.rounded(curves.decision_digits(0.02))
    assert (shown.mean, shown.lo, shown.hi) == (-0.02, -0.02, -0.02) and curves.holds_within(shown, 0.02)
    assert curves.tolerance(["on-policy", "stale"], {"stale": shown}, 0.02) == "stale"
    assert [curves.decision_digits(d) for d in (0.02, 0.0, 0.0025, 0.1, 1e-7)] == [3, 3, 4, 3, 7]


def test_the_common_grid_is_every_step_any_seed_logged():
    same = [curves.Series.of([1, 2, 5], [0.1, 0.2, 0.3]) for _ in range(3)]
    assert curves.common_grid(same).tolist() == [1, 2, 5]
    apart = [*same, curves.Series.of([2, 3, 7], [0.0, 0.0, 0.0]), curves.Series.of([1, 2], [1.0, 1.0])]
    assert curves.common_grid(apart).tolist() == [1, 2, 3, 5, 7]
    assert curves.common_grid([]).tolist() == []
