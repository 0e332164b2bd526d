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


def _resample(scores: np.ndarray, index: np.ndarray) -> np.ndarray:
    """`scores[index[r, i, m], m]`: each task's column resampled by its own run indices."""
    return scores[index, np.arange(scores.shape[1])]


def _interval(samples: np.ndarray, size: float) -> tuple[np.ndarray, np.ndarray]:
    alpha = (1 - size) / 2
    lo, hi = np.percentile(samples, [100 * alpha, 100 * (1 - alpha)], axis=0)
    return lo, hi


def bootstrap(
    scores: Any,
    statistic: Callable[[np.ndarray], np.ndarray],
    reps: int = AGGREGATE_REPS,
    seed: int = SEED,
    size: float = CI_SIZE,
) -> Estimate:
    """`statistic` of `scores` with its stratified percentile bootstrap interval. `statistic` maps
    `[R, N, M]` resamples to `[R]` values."""
    a = _scores(scores)
    rs = np.random.RandomState(seed)
    samples = statistic(_resample(a, _draws(rs, a.shape[0], a.shape, reps)))
    lo, hi = _interval(samples, size)
    return Estimate(float(statistic(a[None])[0]), float(lo), float(hi), reps, seed, a.shape[0], size=size)


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
    rs = np.random.RandomState(seed)
    if a.shape == b.shape:
        # One block draw is the same stream as X then Y rep after rep, when their bounds agree.
        both = _draws(rs, a.shape[0], (2, *a.shape), reps)
        ix, iy = both[:, 0], both[:, 1]
    else:
        pairs = [(rs.choice(a.shape[0], a.shape), rs.choice(b.shape[0], b.shape)) for _ in range(reps)]
        ix = np.stack([p[0] for p in pairs]) if pairs else np.empty((0, *a.shape), dtype=int)
        iy = np.stack([p[1] for p in pairs]) if pairs else np.empty((0, *b.shape), dtype=int)
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
    rs = np.random.RandomState(seed)
    resamples = _resample(a, _draws(rs, a.shape[0], a.shape, reps)).reshape(reps, -1)
    samples = (resamples[:, None, :] > t[None, :, None]).mean(axis=2)
    lo, hi = _interval(samples, size)
    return profile(a, t), lo, hi
