"""The few-seed statistics the RL community recommends (Agarwal et al. 2021, "Deep RL at the Edge of
the Statistical Precipice"; google-research/rliable), reimplemented in numpy and checked against
rliable 1.2 on fixed inputs (tests/platform/dashboards/rliable/).

Scores are arrays `[N runs, M tasks]`: here a run is a seed and a task an evaluation set (one per
comparison cell today). Every interval is a **stratified percentile bootstrap**: each task resamples
its own runs with replacement, `reps` times, from `np.random.RandomState(seed)` drawn in rliable's
order, so with the same seed the intervals are rliable's to the last bit (rliable itself draws from
the global RNG). Every estimate carries its method, reps and seed (`Estimate.record`).

- `iqm`: the interquartile mean, the 25% trimmed mean of all N×M scores pooled.
- `probability_of_improvement`: P(X > Y), per task the Mann–Whitney U of X over Y divided by
  N_x·N_y (ties count ½), averaged over tasks; X and Y resampled independently (unpaired).
  `paired_probability_of_improvement`: for runs that share seeds, the share of seeds where X beats
  Y (ties ½), seed pairs resampled together.
- `profile`: a performance profile, the share of all runs × tasks scoring above τ (strictly).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

METHOD = "percentile"
SEED = 0
CI_SIZE = 0.95
AGGREGATE_REPS = 50_000  # rliable's default for aggregate metrics
POI_REPS = 2_000  # rliable's README for probability of improvement
PROFILE_REPS = 2_000  # rliable's default for performance profiles
# Index draws held in memory at once; the stream is the same however it is cut.
_CHUNK = 2_000_000


@dataclass(frozen=True)
class Estimate:
    """A point estimate and its stratified percentile bootstrap interval, with how it was made."""

    value: float
    lo: float
    hi: float
    reps: int
    seed: int
    n: int  # runs it rests on (per side for a comparison: the fewer)
    method: str = METHOD
    size: float = CI_SIZE

    def record(self) -> dict[str, Any]:
        def number(v: float) -> float | None:
            return float(v) if np.isfinite(v) else None

        return {
            "value": number(self.value),
            "lo": number(self.lo),
            "hi": number(self.hi),
            "n": self.n,
            "method": f"stratified {self.method} bootstrap",
            "reps": self.reps,
            "seed": self.seed,
            "confidence": self.size,
        }


def _scores(scores: Any) -> np.ndarray:
    """`[N, M]` floats from `[N]` (one task) or `[N, M]`; a ValueError for anything else or NaN."""
    a = np.asarray(scores, dtype=float)
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
        raise ValueError(f"scores must be [runs] or [runs, tasks] with at least one run (got {a.shape})")
    if not np.isfinite(a).all():
        raise ValueError("scores must be finite")
    return a


def trimmed_mean(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """The 25% trimmed mean along `axis`, as scipy.stats.trim_mean(…, 0.25) cuts it: ⌊n/4⌋ from
    each end of the sorted values."""
    values = np.sort(values, axis=axis)
    n = values.shape[axis]
    cut = int(0.25 * n)
    return np.take(values, np.arange(cut, n - cut), axis=axis).mean(axis=axis)


def iqm(scores: Any) -> float:
    """The interquartile mean of all runs × tasks pooled (rliable `aggregate_iqm`)."""
    return float(trimmed_mean(_scores(scores).ravel()))


def _draws(rs: np.random.RandomState, n: int, shape: tuple[int, ...], reps: int) -> np.ndarray:
    """`[reps, *shape]` run indices in [0, n): rep after rep, as rliable's `update_indices` draws
    them with `np.random.choice(n, shape)`, cut in chunks that leave the stream unchanged."""
    per = int(np.prod(shape))
    step = max(1, _CHUNK // per)
    parts = [rs.choice(n, (min(step, reps - start), *shape)) for start in range(0, reps, step)]
    return np.concatenate(parts) if parts else np.empty((0, *shape), dtype=int)


def _alternating_draws(
    rs: np.random.RandomState, shape_x: tuple[int, int], shape_y: tuple[int, int], reps: int
) -> tuple[np.ndarray, np.ndarray]:
    """X's then Y's run indices rep after rep, as `rs.choice(n_x, shape_x)`, `rs.choice(n_y, shape_y)`
    would draw them in turn, without a Python call per rep: the legacy generator draws an index
    below n by masked rejection, taking 32-bit words of its Mersenne Twister stream until one,
    masked to the bits n − 1 needs, is below n (none for n = 1); that is replayed here on the
    raw words."""
    state = rs.get_state()
    twister = np.random.MT19937()
    twister.state = {"bit_generator": "MT19937", "state": {"key": state[1], "pos": state[2]}}
    bounds = [shape_x[0]] * int(np.prod(shape_x)) + [shape_y[0]] * int(np.prod(shape_y))
    masks = [(1 << (n - 1).bit_length()) - 1 for n in bounds]
    out: list[int] = []
    words: list[int] = []
    at = 0
    for _ in range(reps):
        for n, mask in zip(bounds, masks, strict=True):
            if n == 1:
                out.append(0)
                continue
            while True:
                if at == len(words):
                    words, at = twister.random_raw(4096).tolist(), 0
                value = words[at] & mask
                at += 1
                if value < n:
                    out.append(value)
                    break
    table = np.array(out, dtype=int).reshape(reps, len(bounds))
    split = int(np.prod(shape_x))
    return table[:, :split].reshape(reps, *shape_x), table[:, split:].reshape(reps, *shape_y)


@functools.lru_cache(maxsize=32)
def fresh_draws(seed: int, n: int, shape: tuple[int, ...], reps: int) -> np.ndarray:
    """`_draws` from a fresh `RandomState(seed)`: the same table for every cell of as many runs,
    so it is drawn once per process (read-only)."""
    table = _draws(np.random.RandomState(seed), n, shape, reps)
    table.flags.writeable = False
    return table


@functools.lru_cache(maxsize=32)
def _fresh_alternating_draws(
    seed: int, shape_x: tuple[int, int], shape_y: tuple[int, int], reps: int
) -> tuple[np.ndarray, np.ndarray]:
    tables = _alternating_draws(np.random.RandomState(seed), shape_x, shape_y, reps)
    for table in tables:
        table.flags.writeable = False
    return tables


@functools.lru_cache(maxsize=32)
def _draw_counts(seed: int, shape: tuple[int, int], reps: int) -> np.ndarray:
    """`[reps, N·M]`: how often each (run, task) of `shape` (N runs × M tasks, flattened as
    `scores.ravel()`) is drawn in each rep of `fresh_draws`, as floats."""
    n, m = shape
    index = fresh_draws(seed, n, shape, reps)  # [reps, N, M]: the run drawn at each place
    keys = (index * m + np.arange(m)) + (np.arange(reps) * n * m)[:, None, None]
    counts = np.bincount(keys.ravel(), minlength=reps * n * m).reshape(reps, n * m).astype(float)
    counts.flags.writeable = False
    return counts


def _resample(scores: np.ndarray, index: np.ndarray) -> np.ndarray:
    """`scores[index[r, i, m], m]`: each task's column resampled by its own run indices."""
    return scores[index, np.arange(scores.shape[1])]


def _interval(samples: np.ndarray, size: float) -> tuple[np.ndarray, np.ndarray]:
    alpha = (1 - size) / 2
    lo, hi = np.percentile(samples, [100 * alpha, 100 * (1 - alpha)], axis=0)
    return lo, hi


def bootstrap_many(
    scores: Any,
    statistics: Sequence[Callable[[np.ndarray], np.ndarray]],
    reps: int = AGGREGATE_REPS,
    seed: int = SEED,
    size: float = CI_SIZE,
) -> list[Estimate]:
    """Each of `statistics` of `scores` with its stratified percentile bootstrap interval, all from
    the same resamples (as separate calls with the same seed would draw them). A statistic maps
    `[R, N, M]` resamples to `[R]` values."""
    a = _scores(scores)
    resamples = _resample(a, fresh_draws(seed, a.shape[0], a.shape, reps))
    out = []
    for statistic in statistics:
        lo, hi = _interval(statistic(resamples), size)
        out.append(
            Estimate(float(statistic(a[None])[0]), float(lo), float(hi), reps, seed, a.shape[0], size=size)
        )
    return out


def bootstrap(
    scores: Any,
    statistic: Callable[[np.ndarray], np.ndarray],
    reps: int = AGGREGATE_REPS,
    seed: int = SEED,
    size: float = CI_SIZE,
) -> Estimate:
    """`statistic` of `scores` with its stratified percentile bootstrap interval."""
    return bootstrap_many(scores, [statistic], reps, seed, size)[0]


def _iqm_rows(resamples: np.ndarray) -> np.ndarray:
    return trimmed_mean(resamples.reshape(len(resamples), -1))


def _mean_rows(resamples: np.ndarray) -> np.ndarray:
    return resamples.reshape(len(resamples), -1).mean(axis=1)


def interval_iqm(scores: Any, reps: int = AGGREGATE_REPS, seed: int = SEED) -> Estimate:
    """IQM with its 95% stratified percentile bootstrap CI (rliable `get_interval_estimates` of
    `aggregate_iqm`)."""
    return bootstrap(scores, _iqm_rows, reps, seed)


def interval_mean(scores: Any, reps: int = AGGREGATE_REPS, seed: int = SEED) -> Estimate:
    """The mean of all runs × tasks with its stratified percentile bootstrap CI."""
    return bootstrap(scores, _mean_rows, reps, seed)


def _poi_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """`[R]` P(X > Y) of resamples `x: [R, Nx, M]`, `y: [R, Ny, M]`: per task the share of (x, y)
    pairs with x > y, ties ½ (Mann–Whitney U / (Nx·Ny)), averaged over tasks."""
    diff = x[:, :, None, :] - y[:, None, :, :]
    wins = (diff > 0).mean(axis=(1, 2)) + 0.5 * (diff == 0).mean(axis=(1, 2))
    return wins.mean(axis=1)


def probability_of_improvement(x: Any, y: Any) -> float:
    """P(X > Y) over unpaired runs (rliable `probability_of_improvement`)."""
    a, b = _scores(x), _scores(y)
    _same_tasks(a, b)
    return float(_poi_rows(a[None], b[None])[0])


def _same_tasks(a: np.ndarray, b: np.ndarray) -> None:
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"X and Y must have the same tasks (got {a.shape[1]} and {b.shape[1]})")


def interval_poi(x: Any, y: Any, reps: int = POI_REPS, seed: int = SEED, size: float = CI_SIZE) -> Estimate:
    """P(X > Y) with its CI, X's and Y's runs resampled independently within each task, X's first
    in each rep (rliable's `StratifiedIndependentBootstrap`)."""
    a, b = _scores(x), _scores(y)
    _same_tasks(a, b)
    if a.shape == b.shape:
        # One block draw is the same stream as X then Y rep after rep, when their bounds agree.
        both = fresh_draws(seed, a.shape[0], (2, *a.shape), reps)
        ix, iy = both[:, 0], both[:, 1]
    else:
        ix, iy = _fresh_alternating_draws(seed, a.shape, b.shape, reps)
    samples = _poi_rows(_resample(a, ix), _resample(b, iy))
    lo, hi = _interval(samples, size)
    n = min(a.shape[0], b.shape[0])
    return Estimate(probability_of_improvement(a, b), float(lo), float(hi), reps, seed, n, size=size)


def interval_paired_poi(
    x: Any, y: Any, reps: int = POI_REPS, seed: int = SEED, size: float = CI_SIZE
) -> Estimate:
    """P(X > Y) for runs paired by seed (row i of `x` and of `y` share seed i): the share of seeds
    where X scores higher, ties ½, averaged over tasks; each task resamples seed pairs together."""
    a, b = _scores(x), _scores(y)
    if a.shape != b.shape:
        raise ValueError(f"paired scores must have the same shape (got {a.shape} and {b.shape})")
    wins = (a > b) + 0.5 * (a == b)
    return bootstrap(wins, _mean_rows, reps, seed, size)


def profile(scores: Any, taus: Sequence[float]) -> np.ndarray:
    """The share of runs × tasks scoring above each τ (strictly; rliable's score distribution)."""
    a = _scores(scores)
    return (a.ravel()[None, :] > np.asarray(taus, dtype=float)[:, None]).mean(axis=1)


def interval_profile(
    scores: Any, taus: Sequence[float], reps: int = PROFILE_REPS, seed: int = SEED, size: float = CI_SIZE
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The profile at each τ with its stratified percentile bootstrap CIs: (values, lo, hi)."""
    a = _scores(scores)
    t = np.asarray(taus, dtype=float)
    # A resample's share above τ counts each run as often as it was drawn: the draw counts of
    # every (run, task) times whether it scores above τ, over the runs × tasks (whole numbers:
    # the same share as the mean over the resampled scores, to the bit).
    above = (a.ravel()[:, None] > t[None, :]).astype(float)
    samples = (_draw_counts(seed, a.shape, reps) @ above) / a.size
    lo, hi = _interval(samples, size)
    return profile(a, t), lo, hi


PROFILE_POINTS = 41
# The comparison page's IQM and mean: fewer reps than rliable's 50,000 (the page is polled while
# runs are going; at 3–10 seeds the intervals move in the fourth decimal), recorded with each.
PAGE_REPS = 10_000
FEW_SEEDS = 5  # fewer runs than this in a cell: the page warns (rliable's advice)


def _cell_scores(values: dict[int, float]) -> tuple[list[int], np.ndarray]:
    seeds = sorted(s for s, v in values.items() if np.isfinite(v))
    return seeds, np.array([values[s] for s in seeds], dtype=float)


def panel(
    finals: dict[tuple[int, str, str], dict[int, float]],
    lines: list[dict[str, Any]],
    staleness: list[str],
    seed: int = SEED,
    reps: int = PAGE_REPS,
) -> dict[str, Any]:
    """The comparison's few-seed statistics from its final values (`finals`: (experiment, line key,
    staleness) → seed → value; one task per cell, so the stratified bootstrap resamples seeds):

    - `cells`: per line and setting, the IQM and the mean with their CIs, and `few_seeds` below 5;
    - `improvement`: per experiment, variant and setting, P(a > b) for every two lines a, b with
      its CI, `paired` when both cells ran the same seeds (seed pairs resampled together), else
      unpaired (each side resampled on its own, as rliable does);
    - `profiles`: per setting, τ on an even grid over that setting's final values and each line's
      share of runs above τ with its CI.
    Every estimate records its method, reps and seed."""
    cells, improvement, profiles = [], [], []
    for line in lines:
        for setting in staleness:
            values = finals.get((line["experiment"], line["key"], setting))
            if not values:
                continue
            _, scores = _cell_scores(values)
            if not len(scores):
                continue
            iqm_, mean = bootstrap_many(scores, [_iqm_rows, _mean_rows], reps, seed)
            cells.append(
                {
                    "line": line["line"],
                    "experiment": line["experiment"],
                    "staleness": setting,
                    "n": len(scores),
                    "few_seeds": len(scores) < FEW_SEEDS,
                    "iqm": iqm_.record(),
                    "mean": mean.record(),
                }
            )
    for setting in staleness:
        present = [
            (line, _cell_scores(finals[(line["experiment"], line["key"], setting)]))
            for line in lines
            if finals.get((line["experiment"], line["key"], setting))
        ]
        present = [(line, (seeds, scores)) for line, (seeds, scores) in present if len(scores)]
        for i, (a, (seeds_a, xa)) in enumerate(present):
            for b, (seeds_b, xb) in present[i + 1 :]:
                if a["experiment"] != b["experiment"] or a["variant_label"] != b["variant_label"]:
                    continue
                paired = seeds_a == seeds_b
                estimate = (
                    interval_paired_poi(xa, xb, seed=seed) if paired else interval_poi(xa, xb, seed=seed)
                )
                improvement.append(
                    {
                        "experiment": a["experiment"],
                        "variant": a["variant_label"],
                        "staleness": setting,
                        "a": a["line"],
                        "b": b["line"],
                        "paired": paired,
                        "poi": estimate.record(),
                    }
                )
        if present:
            everything = np.concatenate([scores for _, (_, scores) in present])
            lo, hi = float(everything.min()), float(everything.max())
            taus = np.linspace(lo, hi, PROFILE_POINTS) if hi > lo else np.array([lo])
            rows = []
            for line, (_, scores) in present:
                values, ci_lo, ci_hi = interval_profile(scores, taus, seed=seed)
                rows.append(
                    {
                        "line": line["line"],
                        "n": len(scores),
                        "value": values.tolist(),
                        "lo": ci_lo.tolist(),
                        "hi": ci_hi.tolist(),
                    }
                )
            profiles.append(
                {
                    "staleness": setting,
                    "taus": taus.tolist(),
                    "lines": rows,
                    "method": f"stratified {METHOD} bootstrap",
                    "reps": PROFILE_REPS,
                    "seed": seed,
                }
            )
    return {"cells": cells, "improvement": improvement, "profiles": profiles, "few_seeds": FEW_SEEDS}
