"""Whether a run's policy collapsed: its held-out accuracy fell to near zero and stayed there.

The rule, on the run's logged `eval/accuracy` points (the held-out greedy accuracy, i.e. the
task's correctness reward on held-out prompts without any format term; rlcore evaluates before
training, every `eval_every` steps and after the last step), taken in step order v_0, …, v_n:

    the run collapsed at evaluation i (1 ≤ i ≤ n) when
      best  = max(v_0, …, v_{i−1}) ≥ MIN_BEST            (there was something to lose), and
      v_j ≤ NEAR_ZERO_FRACTION × best  for every j ≥ i   (it fell to near zero and stayed), and
      n − i + 1 ≥ MIN_EVALS                              (seen at MIN_EVALS evaluations at least).

The earliest such i is the step it collapsed at. Near zero is relative to the run's own earlier
best, so a run that never learned (accuracy near 0 from the start) has not collapsed, and a
run that dips and recovers has not either. A run whose last evaluation alone is low is not
flagged: one reading cannot tell a collapse from a dip. Missing values (NaN) are left out.

Measured with the built-in tiny model (4 prompts × 4 responses, 20 held-out prompts every 2 steps):
lr 1 takes held-out accuracy from 0.50 to 0.00 by step 2 and it stays 0.00 to step 10 (with grpo,
reinforce and rec-oneside-nois alike; lr 5e-4 by step 4); the default lr 3e-5 keeps it at 0.45–0.50.
"""

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
