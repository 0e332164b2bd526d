"""Whether a run's policy collapsed: its held-out accuracy fell to near zero, relative to its own
earlier best, and stayed there for at least `MIN_EVALS` evaluations (docs/algorithms.md §11)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

METRIC = "eval/accuracy"
NEAR_ZERO_FRACTION = 0.1
MIN_BEST = 0.05
MIN_EVALS = 2


@dataclass(frozen=True)
class Collapse:
    """Where a run collapsed: its best held-out accuracy before (and the step of that best), the
    step of the first evaluation near zero, and the last evaluation (step and value)."""

    best: float
    best_step: int
    step: int
    last_step: int
    last: float

    @property
    def threshold(self) -> float:
        return NEAR_ZERO_FRACTION * self.best


def find_collapse(evaluations: Iterable[tuple[int, float | None]]) -> Collapse | None:
    """The collapse of a run with these (step, held-out accuracy) evaluations, or None (module
    docstring for the rule)."""
    points = sorted((step, value) for step, value in evaluations if value is not None and value == value)
    if len(points) < 1 + MIN_EVALS:
        return None
    # highest[j]: the highest value from evaluation j on; a suffix maximum makes the rule one pass.
    highest = [0.0] * len(points)
    running = float("-inf")
    for j in range(len(points) - 1, -1, -1):
        running = max(running, points[j][1])
        highest[j] = running
    best_step, best = points[0]
    for i in range(1, len(points) - MIN_EVALS + 1):
        if best >= MIN_BEST and highest[i] <= NEAR_ZERO_FRACTION * best:
            last_step, last = points[-1]
            return Collapse(best=best, best_step=best_step, step=points[i][0], last_step=last_step, last=last)
        if points[i][1] > best:
            best_step, best = points[i]
    return None
