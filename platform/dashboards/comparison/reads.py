"""What the comparison reads of the runs' metric: each run's points as a series over the query's x
(`_points`, a run with a damaged chunk left out whole) and each run's final value by the query's rule
(`final_values`: from the summaries where the query allows, `stored_finals`), per cell (`Finals`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dashboards.comparison import curves
from dashboards.comparison.grouping import Layout
from dashboards.comparison.query import ComparisonQuery
from experiments import packing, series
from experiments.models import MetricSummary, Run

LENGTH_METRIC = "response_length/mean"


def _rollout(run: Run) -> tuple[int, int]:
    """(prompts per step, responses per prompt) from the run's resolved config."""
    rollout = run.config.get("rollout", {})
    return int(rollout.get("prompts_per_step", 1)), int(rollout.get("group_size", 1))


def _series(run: Run, query: ComparisonQuery, points, lengths) -> curves.Series:
    steps, values, times = points
    if query.x == "step":
        x = steps
    elif query.x == "samples":
        x = curves.samples_x(steps, *_rollout(run))
    elif query.x == "tokens":
        length_steps, length_values, _ = lengths.get(run.pk, (np.empty(0), np.empty(0), None))
        finite = np.isfinite(length_values)
        x = curves.tokens_x(steps, length_steps[finite], length_values[finite], math.prod(_rollout(run)))
    else:
        x = curves.time_x(times)
    return curves.Series.of(x, values)


def stored_finals(run_ids: list[int], query: ComparisonQuery) -> dict[int, float] | None:
    """Each run's final value of the query's metric read from its `MetricSummary` row (one row per
    run, no point read): what `curves.final_value` gives over the run's finite points by step,
    for runs with at least one. None when the query needs the points: x other than step (the
    order and spacing of the points differ), or the mean of more than the last `packing.TAIL`.
    "auc" is the summary's trapezoid sum, accumulated as the points arrived: equal to the one
    over the points up to float rounding (the other rules are the same floats)."""
    if query.x != "step" or (query.rule == "mean_last_k" and query.k > packing.TAIL):
        return None
    rows = MetricSummary.objects.filter(run_id__in=run_ids, name=query.metric, finite__gt=0)
    if query.rule in ("last", "best"):
        field = "last_finite" if query.rule == "last" else "max"
        return dict(rows.values_list("run_id", field))
    if query.rule == "mean_last_k":
        return {
            run_id: packing.mean_last({"tail": packing.unpack_tail(tail)}, query.k)
            for run_id, tail in rows.values_list("run_id", "tail")
        }
    if query.rule == "auc":
        fields = ("finite", "area", "first", "first_step", "last_finite_step")
        return {row["run_id"]: _nan_if_none(packing.auc(row)) for row in rows.values("run_id", *fields)}
    raise ValueError(f"rule must be one of {', '.join(curves.RULES)} (got {query.rule!r})")


def _nan_if_none(value: float | None) -> float:
    return math.nan if value is None else value


def _points(
    runs: list[Run], query: ComparisonQuery, damaged: list[series.Damage] | None = None
) -> dict[int, curves.Series]:
    """Each run's points of the query's metric as a series over the query's x (runs with a
    finite point only). A run with a damaged chunk of the metric (or of the response lengths
    x = tokens counts) is left out whole, its chunks added to `damaged`: its curve would be
    drawn across the gap as if known, and its final value taken where it stops."""
    run_ids = [run.pk for run in runs]
    damaged = [] if damaged is None else damaged
    points = series.by_run(run_ids, query.metric, with_time=query.x == "time", damaged=damaged)
    lengths = series.by_run(run_ids, LENGTH_METRIC, damaged=damaged) if query.x == "tokens" else {}
    hurt = {d.run_id for d in damaged}
    made = {
        run.pk: _series(run, query, points[run.pk], lengths)
        for run in runs
        if run.pk in points and run.pk not in hurt
    }
    return {pk: s for pk, s in made.items() if len(s)}


def damage_warnings(damaged: list[series.Damage]) -> list[dict[str, Any]]:
    """What the comparison says of each damaged chunk `_points` met: the run it left out, and why."""
    return [
        {
            "run": d.run_id,
            "metric": d.name,
            "note": f"Run {d.run_id} is left out of these curves and final values: {d.note()}.",
        }
        for d in damaged
    ]


def final_values(
    runs: list[Run], query: ComparisonQuery, points: dict[int, curves.Series] | None = None
) -> dict[int, float]:
    """Each run's final value by the query's rule, for runs with a finite point that did not end
    early (`Run.ended_early`: a run cancelled, failed or lost before its last step has no final
    value, only an earlier step's): from the summaries where the query allows (`stored_finals`),
    else from `points` (`_points`, read here when not given)."""
    counted = [run for run in runs if not run.ended_early]
    stored = stored_finals([run.pk for run in counted], query)
    if stored is not None:
        return stored
    points = _points(counted, query) if points is None else points
    kept = {run.pk for run in counted}
    return {pk: curves.final_value(s, query.rule, query.k) for pk, s in points.items() if pk in kept}


Cell = tuple[int, str, str]


@dataclass(frozen=True)
class Finals:
    """The final values the panels read, per cell (experiment, line key, staleness label), in the
    page's order: `runs` (run id → value) and `seeds` (seed → value), every run's in `by_run`;
    the runs' `points` (None when not read) and the damaged chunks met reading them."""

    runs: dict[Cell, dict[int, float]]
    seeds: dict[Cell, dict[int, float]]
    by_run: dict[int, float]
    points: dict[int, curves.Series] | None
    damaged: list[series.Damage]

    @classmethod
    def read(cls, layout: Layout, query: ComparisonQuery, points: bool = True) -> Finals:
        """With `points`, the curves' points are read and a cell's final values are those of its
        runs with a curve (a finite point, no damaged chunk) that did not end early; without, its
        runs' with a final value (`final_values`: the points are read only when the query needs
        them)."""
        damaged: list[series.Damage] = []
        if points:
            read = _points(layout.runs, query, damaged)
            every = final_values(layout.runs, query, read)

            def cell_finals(group_runs: list[Run]) -> dict[int, float]:
                return {
                    run.pk: every.get(run.pk, math.nan)
                    for run in group_runs
                    if run.pk in read and not run.ended_early
                }

        else:
            read = None
            every = final_values(layout.runs, query)

            def cell_finals(group_runs: list[Run]) -> dict[int, float]:
                return {run.pk: every[run.pk] for run in group_runs if run.pk in every}

        by_cell: dict[Cell, dict[int, float]] = {}
        by_seed: dict[Cell, dict[int, float]] = {}
        by_run: dict[int, float] = {}
        for line, setting, _, group_runs in layout.cells():
            cell = (line["experiment"], line["key"], setting)
            by_cell[cell] = cell_finals(group_runs)
            by_run |= by_cell[cell]
            by_seed[cell] = {run.seed: by_cell[cell][run.pk] for run in group_runs if run.pk in by_cell[cell]}
        return cls(runs=by_cell, seeds=by_seed, by_run=by_run, points=read, damaged=damaged)
