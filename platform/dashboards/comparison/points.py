"""Float arrays (a metric's steps and values, `experiments.series`) as short JSON lists."""

from __future__ import annotations

import math

import numpy as np


def json_numbers(values: np.ndarray) -> list[float | int | None]:
    """A float array as a short JSON list: ints when whole, else 6 significant digits of its largest
    magnitude; NaN as null."""
    finite = np.isfinite(values)
    if not finite.any():
        return [None] * len(values)
    if finite.all() and np.all(values == np.round(values)) and np.abs(values).max() < 2**53:
        return values.astype(np.int64).tolist()
    scale = np.abs(values[finite]).max()
    decimals = 0 if scale == 0 else int(np.clip(5 - math.floor(math.log10(scale)), -10, 15))
    out = np.round(values, decimals).tolist()
    return out if finite.all() else [v if f else None for v, f in zip(out, finite.tolist(), strict=True)]
