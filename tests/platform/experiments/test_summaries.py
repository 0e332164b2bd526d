"""A metric's summary has one rule (`packing.extend`): the summary of a whole series is the empty
summary extended by all its points, so a summary extended flush by flush, as the sink keeps it,
is that of the whole series to the bit, overflow and points that are not finite included."""

from __future__ import annotations

import math

import numpy as np
import pytest

from experiments import packing


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[k] == b[k] or (isinstance(a[k], float) and math.isnan(a[k]) and math.isnan(b[k])) for k in a
    )


@pytest.mark.parametrize("seed", range(8))
def test_a_summary_extended_flush_by_flush_is_that_of_the_whole_series_to_the_bit(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    steps = np.cumsum(rng.integers(1, 30, size=n)) - 50
    values = rng.normal(size=n) * 10.0 ** rng.integers(-3, 3, size=n)
    values[rng.random(n) < 0.2] = np.nan
    values[rng.random(n) < 0.05] = np.inf
    values[rng.random(n) < 0.05] = -np.inf
    if seed % 2:  # sums that overflow: None from then on
        values[rng.random(n) < 0.3] = 1.7e308
    whole = packing.summarise(steps, values)
    assert _same(whole, packing.extend(packing.empty_summary(), steps, values))
    summary = packing.empty_summary()
    for part in np.array_split(np.arange(n), int(rng.integers(1, 12))):
        packing.extend(summary, steps[part].tolist(), values[part].tolist())  # as the sink's writer
    assert _same(summary, whole)
    # A few points at a time (one by one in Python) against many at once (numpy): the same bits.
    few, start = packing.empty_summary(), 0
    while start < n:
        stop = start + int(rng.integers(1, packing.MANY))
        packing.extend(few, steps[start:stop], values[start:stop])
        start = stop
    assert _same(few, whole)


def test_a_summary_counts_every_point_and_sums_the_finite_ones():
    summary = packing.summarise(np.array([1, 2, 4, 5]), np.array([1.0, np.nan, 3.0, np.inf]))
    assert summary == {
        "count": 4,
        "last_step": 5,
        "last": None,
        "finite": 2,
        "first_step": 1,
        "first": 1.0,
        "last_finite_step": 4,
        "last_finite": 3.0,
        "min": 1.0,
        "max": 3.0,
        "total": 4.0,
        "area": 6.0,  # (4 - 1) × (1 + 3) / 2
        "tail": [1.0, 3.0],
    }
    overflowed = packing.summarise(np.array([1, 2, 3]), np.array([1.7e308, 1.7e308, -1.7e308]))
    assert overflowed["total"] is None and overflowed["area"] is None, "stays None once it overflowed"
    assert packing.summarise(np.array([7]), np.array([np.nan])) == packing.empty_summary() | {
        "count": 1,
        "last_step": 7,
    }
