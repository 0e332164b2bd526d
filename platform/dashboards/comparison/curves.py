"""Seed aggregation for the comparison (pure numpy, no Django): align seeds on a common grid,
average with a band (std, min–max, bootstrap CI), downsample keeping spikes, final values and
their paired differences, tolerance and the seeds needed to tell presets apart. The statistics
and their edge cases: docs/algorithms.md §12."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

X_AXES = ("step", "samples", "tokens", "time")
BANDS = ("std", "minmax", "ci", "none")
RULES = ("last", "mean_last_k", "best", "auc")
MAX_BUCKETS = 1000
# Above this many distinct x values (wall time and tokens differ between seeds) the grid is evenly spaced.
MAX_GRID = 4000
BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0
CI_LEVEL = 0.95
MIN_CI_SEEDS = 5  # fewer seeds get their min–max, not a bootstrap CI
CI, MINMAX = "95% bootstrap CI", "min–max"
SHOWN_DIGITS = 3  # decimals of the changes the pages show (more when δ needs them)


def interval_kind(n: int) -> str | None:
    """What the interval over `n` seeds is: a bootstrap CI from `MIN_CI_SEEDS` on, the min–max
    below that, none for one seed."""
    if n >= MIN_CI_SEEDS:
        return CI
    return MINMAX if n >= 2 else None


def decision_digits(delta: float) -> int:
    """Decimals at which changes are shown and compared with δ: `SHOWN_DIGITS`, or as many as δ
    itself has (δ = 0.0025 needs 4), at most 10."""
    for digits in range(SHOWN_DIGITS, 10):
        if round(delta, digits) == delta:
            return digits
    return 10


@dataclass(frozen=True)
class Series:
    """One run's metric: `x: [N]` strictly increasing, `y: [N]` finite."""

    x: np.ndarray
    y: np.ndarray

    @classmethod
    def of(cls, x: Sequence[float], y: Sequence[float | None]) -> Series:
        """From points in any order; points with a missing (None/NaN) value are dropped."""
        xs = np.asarray(x, dtype=float)
        ys = np.asarray(y, dtype=float)  # None becomes NaN
        keep = np.isfinite(ys) & np.isfinite(xs)
        xs, ys = xs[keep], ys[keep]
        order = np.argsort(xs, kind="stable")
        xs, ys = xs[order], ys[order]
        # Equal x (e.g. two steps logged in the same instant): the later point wins.
        last = np.append(xs[1:] != xs[:-1], True)[: len(xs)]
        return cls(xs[last], ys[last])

    def __len__(self) -> int:
        return len(self.x)


@dataclass(frozen=True)
class Curve:
    """A group's aggregate on the grid `x: [G]`: mean, band `lo/hi` (None for band "none"), seeds per point."""

    x: np.ndarray
    mean: np.ndarray
    lo: np.ndarray | None
    hi: np.ndarray | None
    n: np.ndarray

    def take(self, index: np.ndarray) -> Curve:
        return Curve(
            self.x[index],
            self.mean[index],
            None if self.lo is None else self.lo[index],
            None if self.hi is None else self.hi[index],
            self.n[index],
        )


def samples_x(steps: np.ndarray, prompts_per_step: int, group_size: int) -> np.ndarray:
    """Samples seen after each step: step × (prompts per step × responses per prompt)."""
    return steps * (prompts_per_step * group_size)


def tokens_x(
    steps: np.ndarray, length_steps: np.ndarray, mean_lengths: np.ndarray, batch_size: int
) -> np.ndarray:
    """Response tokens seen after each of `steps`, approximated from the logged mean response length.

    Training step t ≥ 1 is counted as `batch_size × response_length/mean(t)` tokens (prompt
    tokens are not counted; step 0 is before training); the cumulative count, 0 at step 0, is
    interpolated at `steps`. Without any logged length the x values are unknown (NaN).
    """
    trained = length_steps > 0
    if not trained.any():
        return np.full(len(steps), np.nan)
    knots = np.concatenate([[0.0], length_steps[trained]])
    cumulative = np.concatenate([[0.0], np.cumsum(mean_lengths[trained] * batch_size)])
    return np.interp(steps, knots, cumulative, left=0.0)


def time_x(wall_times_s: np.ndarray) -> np.ndarray:
    """Seconds since the run's first logged point."""
    return wall_times_s - wall_times_s.min() if len(wall_times_s) else wall_times_s


def common_grid(series: Sequence[Series]) -> np.ndarray:
    """Every x any seed logged (exact for steps), or `MAX_GRID` even points over the span if more."""
    if not series:
        return np.empty(0)
    first = series[0].x
    if all(len(s.x) == len(first) and np.array_equal(s.x, first) for s in series[1:]):
        xs = first  # the seeds logged the same steps (the usual case): no sort of them all
    else:
        xs = np.unique(np.concatenate([s.x for s in series]))
    if len(xs) > MAX_GRID:
        return np.linspace(xs[0], xs[-1], MAX_GRID)
    return xs


def align(series: Sequence[Series], grid: np.ndarray) -> np.ndarray:
    """`[S, G]` values of each seed interpolated on `grid`; NaN outside a seed's own x range."""
    values = np.full((len(series), len(grid)), np.nan)
    for i, s in enumerate(series):
        if len(s) == 0:
            continue
        inside = (grid >= s.x[0]) & (grid <= s.x[-1])
        values[i, inside] = np.interp(grid[inside], s.x, s.y)
    return values


@functools.lru_cache(maxsize=64)
def resample_counts(n_seeds: int, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """`[BOOTSTRAP_RESAMPLES, n_seeds]` multinomial draw counts of a fresh `default_rng(seed)`:
    the same for every group of as many seeds, so drawn once per process (read-only)."""
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n_seeds, np.full(n_seeds, 1 / n_seeds), size=BOOTSTRAP_RESAMPLES).astype(float)
    counts.flags.writeable = False
    return counts


def bootstrap_ci(values: np.ndarray, seed: int = BOOTSTRAP_SEED) -> tuple[np.ndarray, np.ndarray]:
    """95% percentile bootstrap CI of the mean over seeds, per column of `values: [S, G]` (NaN = absent).

    Each resample draws S seeds with replacement (multinomial counts `[R, S]`), shared by all
    columns; a resample's mean at a column averages only the drawn seeds present there.
    """
    counts = resample_counts(values.shape[0], seed)
    present = np.isfinite(values)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = (counts @ np.where(present, values, 0.0)) / (counts @ present)
    tail = (1 - CI_LEVEL) / 2 * 100
    lo, hi = nan_percentile_columns(means, [tail, 100 - tail])
    return lo, hi


def nan_percentile_columns(values: np.ndarray, q: Sequence[float]) -> np.ndarray:
    """`np.nanpercentile(values, q, axis=0)` to the bit, fast: numpy's goes column by column in
    Python, so only the columns with a NaN go that way and the others all at once through
    `np.percentile` (the same interpolation of the same order statistics)."""
    gaps = np.isnan(values).any(axis=0)
    if not gaps.any():
        return np.percentile(values, q, axis=0)
    out = np.empty((len(q), values.shape[1]))
    out[:, ~gaps] = np.percentile(values[:, ~gaps], q, axis=0)
    out[:, gaps] = np.nanpercentile(values[:, gaps], q, axis=0)
    return out


def aggregate(series: Sequence[Series], band: str, grid: np.ndarray | None = None) -> Curve:
    """Mean over seeds on `grid` (default `common_grid`) with the chosen band."""
    if band not in BANDS:
        raise ValueError(f"band must be one of {', '.join(BANDS)} (got {band!r})")
    grid = common_grid(series) if grid is None else grid
    values = align(series, grid)
    present = np.isfinite(values)
    n = present.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(present, values, 0.0).sum(axis=0) / n
        if band == "std":
            squares = np.where(present, (values - mean) ** 2, 0.0).sum(axis=0)
            std = np.where(n > 1, np.sqrt(squares / np.maximum(n - 1, 1)), 0.0)
            lo, hi = mean - std, mean + std
        elif band == "minmax":
            lo = np.where(present, values, np.inf).min(axis=0, initial=np.inf)
            hi = np.where(present, values, -np.inf).max(axis=0, initial=-np.inf)
            lo, hi = np.where(n > 0, lo, np.nan), np.where(n > 0, hi, np.nan)
        elif band == "ci":
            lo, hi = bootstrap_ci(values) if len(series) else (mean, mean)
        else:
            lo = hi = None
    return Curve(grid, mean, lo, hi, n)


def _bucket_width(n: int, max_buckets: int) -> int:
    """Points per bucket so that `n` points make at most `max_buckets` buckets (1: no downsampling)."""
    return 1 if n <= max_buckets else -(-n // max_buckets)


def dropped_as_gaps(steps: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A metric's points with a NaN at each step its own cadence (the commonest step between two of
    its points) passes over: a value the logging tool dropped (prime-rl drops NaN and inf) becomes
    a break in the line instead of a straight line across it. Left as they are when the steps
    follow no cadence (the points would be more gaps than values)."""
    if steps.size < 3:
        return steps, values
    diffs, counts = np.unique(np.diff(steps), return_counts=True)
    stride = int(diffs[np.argmax(counts)])
    if stride <= 0 or (int(steps[-1]) - int(steps[0])) // stride + 1 > 2 * steps.size:
        return steps, values
    missing = np.setdiff1d(np.arange(int(steps[0]), int(steps[-1]) + 1, stride), steps)
    if missing.size == 0:
        return steps, values
    order = np.argsort(np.concatenate([steps, missing]), kind="stable")
    return (
        np.concatenate([steps, missing])[order],
        np.concatenate([values.astype(float), np.full(missing.size, np.nan)])[order],
    )


def downsample_index(y: np.ndarray, max_buckets: int = MAX_BUCKETS) -> np.ndarray:
    """Indices to keep of `y: [N]`: per bucket of consecutive points its min, max and last; the first point.

    At most `max_buckets` buckets, so at most `3 × max_buckets + 1` points. NaN counts as
    neither min nor max.
    """
    n = len(y)
    width = _bucket_width(n, max_buckets)
    if width == 1:
        return np.arange(n)
    n_buckets = -(-n // width)
    padded = np.full(n_buckets * width, np.nan)
    padded[:n] = y
    rows = padded.reshape(n_buckets, width)
    offsets = np.arange(n_buckets) * width
    lowest = np.where(np.isnan(rows), np.inf, rows).argmin(axis=1) + offsets
    highest = np.where(np.isnan(rows), -np.inf, rows).argmax(axis=1) + offsets
    last = np.minimum(offsets + width, n) - 1
    return np.unique(np.concatenate([[0], lowest, highest, last]))


def downsample(curve: Curve, max_buckets: int = MAX_BUCKETS) -> Curve:
    """`curve` at the points `downsample_index` keeps of its mean, with the band as an envelope.

    Each kept point's band is its bucket's lowest `lo` and highest `hi`, so a spike that only the
    band shows (seeds spiking in opposite directions leave the mean flat) survives too; the band
    can only get wider, never hide anything.
    """
    index = downsample_index(curve.mean, max_buckets)
    shown = curve.take(index)
    width = _bucket_width(len(curve.x), max_buckets)
    if curve.lo is None or width == 1:
        return shown
    starts = np.arange(0, len(curve.x), width)
    bucket = index // width
    # fmin / fmax skip NaN (grid points no seed covers) unless the whole bucket is NaN.
    lo = np.fmin.reduceat(curve.lo, starts)[bucket]
    hi = np.fmax.reduceat(curve.hi, starts)[bucket]
    return Curve(shown.x, shown.mean, lo, hi, shown.n)


def final_value(series: Series, rule: str, k: int = 10) -> float:
    """One number per run: its last value, mean of the last `k`, best (max), or AUC / x span."""
    if len(series) == 0:
        return float("nan")
    if rule == "last":
        return float(series.y[-1])
    if rule == "mean_last_k":
        if k < 1:
            raise ValueError(f"k must be ≥ 1 (got {k})")
        return float(series.y[-k:].mean())
    if rule == "best":
        return float(series.y.max())
    if rule == "auc":
        span = series.x[-1] - series.x[0]
        if span == 0:
            return float(series.y[0])
        return float(np.trapezoid(series.y, series.x) / span)
    raise ValueError(f"rule must be one of {', '.join(RULES)} (got {rule!r})")


@dataclass(frozen=True)
class Summary:
    """A group's final value across seeds: mean, an interval (`interval`: a 95% bootstrap CI, the
    min–max below `MIN_CI_SEEDS` seeds, None for one), std and the per-seed values."""

    mean: float
    lo: float
    hi: float
    std: float
    n_seeds: int
    values: list[float]

    @property
    def interval(self) -> str | None:
        return interval_kind(self.n_seeds)


def _interval(values: np.ndarray, seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """(lo, hi) of `values` as `interval_kind` says: bootstrap CI, min–max, or NaN."""
    kind = interval_kind(len(values))
    if kind == CI:
        lo, hi = bootstrap_ci(values[:, None], seed)
        return float(lo[0]), float(hi[0])
    if kind == MINMAX:
        return float(values.min()), float(values.max())
    return float("nan"), float("nan")


def summarise(values: Sequence[float]) -> Summary:
    """Mean and interval of per-seed final values (NaN values, runs with no points, are left out)."""
    finite = np.asarray([v for v in values if np.isfinite(v)], dtype=float)
    if len(finite) == 0:
        return Summary(float("nan"), float("nan"), float("nan"), float("nan"), 0, [])
    lo, hi = _interval(finite)
    std = float(finite.std(ddof=1)) if len(finite) > 1 else 0.0
    return Summary(float(finite.mean()), lo, hi, std, len(finite), finite.tolist())


# Two-sided α = 0.05 and power 0.8 for the seeds-needed figure: z_{0.975} and z_{0.8}.
Z_975 = 1.959963984540054
Z_80 = 0.8416212335729143


@dataclass(frozen=True)
class Difference:
    """`a − b` paired by seed: the mean of the per-seed differences, its interval over seed pairs
    (a 95% bootstrap CI from `MIN_CI_SEEDS` pairs, their min–max below, NaN with one pair: one pair
    says nothing about the spread), the sample std of the differences (NaN below 2 pairs) and the
    seeds paired."""

    mean: float
    lo: float
    hi: float
    std: float
    seeds: list[int]

    @property
    def n_pairs(self) -> int:
        return len(self.seeds)

    @property
    def interval(self) -> str | None:
        return interval_kind(self.n_pairs)

    @property
    def has_interval(self) -> bool:
        return self.interval is not None

    def contains_zero(self) -> bool:
        """Whether the interval cannot tell the difference from 0 (true without one)."""
        return not self.has_interval or self.lo <= 0 <= self.hi

    def rounded(self, digits: int) -> Difference:
        """The difference as shown, to `digits` decimals: what every decision compares."""
        return Difference(
            float(round(self.mean, digits)),
            float(round(self.lo, digits)),
            float(round(self.hi, digits)),
            self.std,
            self.seeds,
        )


def paired_difference(
    a: Mapping[int, float], b: Mapping[int, float], seed: int = BOOTSTRAP_SEED
) -> Difference:
    """`a[s] − b[s]` over the seeds `s` both have finite values for (same seed: same prompts at
    every step), with its interval (a percentile bootstrap CI that resamples seed pairs with a fixed
    RNG seed, from `MIN_CI_SEEDS` pairs; their min–max below)."""
    seeds = sorted(s for s in a.keys() & b.keys() if np.isfinite(a[s]) and np.isfinite(b[s]))
    if not seeds:
        return Difference(float("nan"), float("nan"), float("nan"), float("nan"), [])
    d = np.array([a[s] - b[s] for s in seeds], dtype=float)
    lo, hi = _interval(d, seed)
    std = float(d.std(ddof=1)) if len(d) > 1 else float("nan")
    return Difference(float(d.mean()), lo, hi, std, seeds)


def seeds_needed(difference: Difference) -> int | None:
    """Seeds per preset for a paired difference like the observed one to be told from 0 (two-sided
    α = 0.05, power 0.8): ⌈((z_{0.975} + z_{0.8}) · σ_d / Δ)²⌉, at least 2; None ("cannot tell with
    these data") when the observed mean difference Δ is 0 or σ_d is unknown (fewer than 2 pairs)."""
    if not difference.has_interval or not np.isfinite(difference.std) or difference.mean == 0:
        return None
    n = ((Z_975 + Z_80) * difference.std / abs(difference.mean)) ** 2
    return max(2, int(np.ceil(n - 1e-9)))


def holds_within(difference: Difference | None, delta: float) -> bool:
    """Whether the change's interval lies no more than `delta` below 0 (a change up is no loss)."""
    return difference is not None and difference.has_interval and difference.lo >= -delta


def tolerance(settings: Sequence[str], drops: Mapping[str, Difference], delta: float) -> str | None:
    """The stalest of `settings` (ordered from on-policy to the stalest, on-policy first, its own
    reference) up to which every drop's interval stays within `delta` below 0: a preset tolerates
    a setting only if it also tolerates every less stale one. None when `settings` is empty."""
    tolerated = settings[0] if settings else None
    for setting in settings[1:]:
        if not holds_within(drops.get(setting), delta):
            break
        tolerated = setting
    return tolerated


def scalar(value: float) -> float | None:
    """A number for JSON: None where it is not finite."""
    return value if math.isfinite(value) else None


def interval_fields(result: Summary | Difference, prefix: str = "") -> dict[str, Any]:
    """`lo`, `hi` and `interval` (its kind: 95% bootstrap CI, min–max, or None for one seed), and
    `ci_lo`, `ci_hi`: the same bounds when they are a CI, else None; each name after `prefix`."""
    ci = result.interval == CI
    return {
        f"{prefix}lo": scalar(result.lo),
        f"{prefix}hi": scalar(result.hi),
        f"{prefix}interval": result.interval,
        f"{prefix}ci_lo": scalar(result.lo) if ci else None,
        f"{prefix}ci_hi": scalar(result.hi) if ci else None,
    }


def difference_fields(d: Difference) -> dict[str, Any]:
    """A paired difference as the payload gives it: `n_seeds` (pairs), `value`, its interval, `std`."""
    return {"n_seeds": d.n_pairs, "value": scalar(d.mean), **interval_fields(d), "std": scalar(d.std)}
