"""Comparison of runs: one metric of every run, aggregated per (experiment, preset, staleness) group.

The runs are an experiment's, or any runs of the user's teams picked by hand (`parse_run_ids`).
`ComparisonQuery.parse` validates the query string (metric, x, band, rule, k) and names the
parameter that is wrong. `compare` reads only the chosen metric's points of the runs in one
query (plus the mean response lengths when x is tokens; on PostgreSQL as one binary array per
run, see `_points_by_run_postgresql`), turns each run into a `curves.Series` on the chosen x
axis, and returns per group the downsampled mean curve with its band, and per group the final
value across seeds (`summary`, with how many of its runs collapsed: `experiments.collapse`) and
the group's trainer throughput across seeds (`throughput`: steps per hour = 3600 / the run's
mean logged `time/step_s`, and the run's mean logged `tokens_per_s`, both aggregated in the
database as part of the runs query); per run (`runs`) its final value and whether it collapsed.
A line is one preset of one experiment (seeds of different experiments are never averaged
together). Groups come in a fixed order: experiments by id, presets in `rlcore.presets` order,
staleness settings from on-policy to the stalest (`staleness_rank`, so the degradation plot reads
left to right). Each preset has one colour everywhere, keyed by that order. On top, the staleness answer
(`staleness_answer`): each line's drop from its own on-policy runs paired by seed, its tolerance
within δ (`delta` in the query) and rank, presets that cannot be told apart with the seeds that
would, and the paper's claims checked (`findings`).
"""

from __future__ import annotations

import csv
import functools
import io
import math
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
from django.db import connection
from django.db.models import Avg, OuterRef, QuerySet, Subquery
from django.http import QueryDict

from experiments import curves, findings
from experiments.models import Experiment, MetricPoint, Run
from rlcore.presets import preset_names
from rlcore.sinks import EVAL_METRICS, STEP_METRICS
from rlcore.staleness import staleness as staleness_lag

METRICS = (*STEP_METRICS, *EVAL_METRICS)
LENGTH_METRIC = "response_length/mean"
SCATTER_METRICS = ("kl/init", "reward/mean")
STEP_TIME_METRIC = "time/step_s"
TOKEN_RATE_METRIC = "tokens_per_s"
THROUGHPUT_COLUMNS = (
    "steps_per_hour",
    "steps_per_hour_lo",
    "steps_per_hour_hi",
    "steps_per_hour_interval",
    "tokens_per_s",
    "tokens_per_s_lo",
    "tokens_per_s_hi",
    "tokens_per_s_interval",
)
MAX_K = 100_000
MAX_DELTA = 1e6
MAX_SELECTED_RUNS = 500
POINT_DTYPE = np.dtype([("run", "i8"), ("step", "f8"), ("value", "f8")])
# Tableau 20 minus greys: one colour per rlcore preset, in PRESETS order; unknown presets cycle.
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#17becf",
    "#aec7e8",
    "#ffbb78",
    "#98df8a",
    "#ff9896",
    "#c5b0d5",
    "#c49c94",
    "#f7b6d2",
    "#dbdb8d",
    "#9edae5",
)


def preset_colours(presets: list[str]) -> dict[str, str]:
    """The site-wide colour of each preset: its position in `rlcore.presets`, then the others in turn."""
    known = preset_names()
    extra = [p for p in presets if p not in known]
    return {p: PALETTE[(known + extra).index(p) % len(PALETTE)] for p in presets}


def preset_sort_key(preset: str) -> tuple[int, str]:
    known = preset_names()
    return (known.index(preset), "") if preset in known else (len(known), preset)


class QueryError(ValueError):
    def __init__(self, param: str, message: str):
        self.param = param
        self.message = message
        super().__init__(f"{param}: {message}")


def _choice(params: QueryDict, name: str, choices: tuple[str, ...], default: str) -> str:
    value = params.get(name, default)
    if value not in choices:
        raise QueryError(name, f"{name} must be one of {', '.join(choices)} (got {value!r})")
    return value


@dataclass(frozen=True)
class ComparisonQuery:
    metric: str = "eval/accuracy"
    x: str = "step"
    band: str = "std"
    rule: str = "last"
    k: int = 10
    delta: float = 0.02

    @classmethod
    def parse(cls, params: QueryDict) -> ComparisonQuery:
        metric = params.get("metric", cls.metric)
        if not 0 < len(metric) <= 100 or "\x00" in metric:
            raise QueryError(
                "metric", f"metric must be a metric name of 1 to 100 characters (got {metric!r})"
            )
        k_text = params.get("k", str(cls.k))
        if not k_text.isdigit() or not 1 <= int(k_text) <= MAX_K:
            raise QueryError("k", f"k must be a whole number from 1 to {MAX_K} (got {k_text!r})")
        delta_text = params.get("delta", str(cls.delta))
        try:
            delta = float(delta_text)
        except ValueError:
            delta = math.nan
        if not 0 <= delta <= MAX_DELTA:
            raise QueryError(
                "delta",
                f"delta must be a number from 0 to {MAX_DELTA:g}, the change in the metric that counts "
                f"(0.02 is 2 points of accuracy) (got {delta_text!r})",
            )
        return cls(
            metric=metric,
            x=_choice(params, "x", curves.X_AXES, cls.x),
            band=_choice(params, "band", curves.BANDS, cls.band),
            rule=_choice(params, "rule", curves.RULES, cls.rule),
            k=int(k_text),
            delta=delta,
        )


def parse_run_ids(params: QueryDict) -> list[int]:
    """The hand-picked runs of `?runs=1,2&runs=3`: distinct ids in the order given."""
    texts = [t.strip() for value in params.getlist("runs") for t in value.split(",") if t.strip()]
    bad = [t for t in texts if not t.isdigit() or len(t) > 18]
    if bad:
        raise QueryError("runs", f"runs must be run ids (whole numbers) separated by commas (got {bad[0]!r})")
    ids = list(dict.fromkeys(int(t) for t in texts))
    if not 1 <= len(ids) <= MAX_SELECTED_RUNS:
        raise QueryError("runs", f"runs must name 1 to {MAX_SELECTED_RUNS} runs (got {len(ids)})")
    return ids


def selected_runs(visible: QuerySet[Run], ids: list[int]) -> QuerySet[Run]:
    """The runs `ids` among `visible`; a QueryError naming the ids that are not there."""
    found = set(visible.filter(pk__in=ids).values_list("pk", flat=True))
    missing = [str(i) for i in ids if i not in found]
    if missing:
        raise QueryError("runs", f"no run {', '.join(missing[:10])} in your teams")
    return visible.filter(pk__in=ids)


Points = dict[int, tuple[np.ndarray, np.ndarray, np.ndarray | None]]


def _points_by_run(run_ids: list[int], name: str, with_time: bool = False) -> Points:
    """(steps, values, wall times in s or None) of metric `name` per run, sorted by step, from one
    query; a missing value (NaN or infinity when logged) is NaN."""
    if not run_ids:
        return {}
    if connection.vendor == "postgresql":
        return _points_by_run_postgresql(run_ids, name, with_time)
    fields = ["run_id", "step", "value"] + (["wall_time"] if with_time else [])
    rows = list(
        MetricPoint.objects.filter(run_id__in=run_ids, name=name)
        .order_by("run_id", "step")
        .values_list(*fields)
    )
    if not rows:
        return {}
    # fromiter with a record dtype is the fastest way from tuples to arrays here; a None value becomes NaN.
    table = np.fromiter((r[:3] for r in rows) if with_time else rows, dtype=POINT_DTYPE, count=len(rows))
    times = np.array([r[3].timestamp() for r in rows]) if with_time else None
    run_column, steps, values = table["run"], table["step"], table["value"]
    starts = np.flatnonzero(np.diff(run_column, prepend=-1))
    ends = np.append(starts[1:], len(table))
    return {
        int(run_column[a]): (steps[a:b], values[a:b], None if times is None else times[a:b])
        for a, b in zip(starts, ends, strict=True)
    }


def _points_by_run_postgresql(run_ids: list[int], name: str, with_time: bool) -> Points:
    """`_points_by_run` on PostgreSQL: one row per run, each column one array in binary form.

    Hundreds of thousands of (run, step, value) rows cost far more to turn into Python tuples than
    to read: here the server aggregates each run's points into arrays (read from the covering
    unique index alone), `array_send` gives their binary form, and numpy reads that directly.
    `array_agg` without ORDER BY avoids a sort per run on the server; the arrays of one row are
    built from the same rows in the same order, so they are sorted by step here instead.
    """
    columns = ["array_send(array_agg(step))", "array_send(array_agg(coalesce(value, 'NaN')))"]
    if with_time:
        columns.append("array_send(array_agg(extract(epoch from wall_time)::float8))")
    sql = (
        f"SELECT run_id, {', '.join(columns)} FROM {connection.ops.quote_name(MetricPoint._meta.db_table)} "
        "WHERE name = %s AND run_id = ANY(%s) GROUP BY run_id"
    )
    connection.ensure_connection()
    started = time.monotonic()
    # A plain psycopg cursor (Django's binds parameters on the client, which rules out binary results).
    with psycopg.Cursor(connection.connection) as cursor:
        rows = cursor.execute(sql, [name, run_ids], binary=True).fetchall()
    if connection.queries_logged:  # shown to Django's query log like any other query
        connection.queries_log.append(
            {"sql": sql % (repr(name), run_ids), "time": f"{time.monotonic() - started:.3f}"}
        )
    points: Points = {}
    for run_id, steps_bytes, values_bytes, *times_bytes in rows:
        steps = _binary_array(steps_bytes, ">i4").astype(float)
        order = np.argsort(steps, kind="stable")
        values = _binary_array(values_bytes, ">f8")[order]
        times = _binary_array(times_bytes[0], ">f8")[order] if with_time else None
        points[run_id] = (steps[order], values, times)
    return points


def _binary_array(data: bytes, element: str) -> np.ndarray:
    """A one-dimensional PostgreSQL array without NULLs, from its binary form (`array_send`):
    a header (dimensions, has-nulls flag, element type, then length and lower bound per dimension),
    then each element as its byte length and its big-endian bytes."""
    dims, has_nulls, _, length, _ = np.frombuffer(data, dtype=">i4", count=5)
    if dims != 1 or has_nulls:
        raise ValueError(f"expected a 1-d array without NULLs (dimensions {dims}, has NULLs {has_nulls})")
    pairs = np.frombuffer(data, dtype=[("size", ">i4"), ("value", element)], offset=20, count=length)
    return pairs["value"].astype(element[1:])


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


def _scalar(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _mean_of(name: str) -> Subquery:
    """The mean of metric `name` over the outer run's steps (missing values left out; None if none)."""
    return Subquery(
        MetricPoint.objects.filter(run=OuterRef("pk"), name=name)
        .order_by()
        .values("run")
        .annotate(mean=Avg("value"))
        .values("mean")
    )


def _steps_per_hour(run: Run) -> float:
    """3600 / the run's mean trainer step time (waiting for the batch plus the update); NaN if unknown."""
    mean_step_s = run.mean_step_s
    return 3600.0 / mean_step_s if mean_step_s is not None and mean_step_s > 0 else math.nan


def _tokens_per_s(run: Run) -> float:
    """The run's mean logged tokens per second; NaN if unknown."""
    return math.nan if run.mean_tokens_per_s is None else run.mean_tokens_per_s


def _interval_fields(result: curves.Summary | curves.Difference, prefix: str = "") -> dict[str, Any]:
    """`lo`, `hi` and `interval` (its kind: 95% bootstrap CI, min–max, or None for one seed), and
    `ci_lo`, `ci_hi`: the same bounds when they are a CI, else None."""
    ci = result.interval == curves.CI
    return {
        f"{prefix}lo": _scalar(result.lo),
        f"{prefix}hi": _scalar(result.hi),
        f"{prefix}interval": result.interval,
        f"{prefix}ci_lo": _scalar(result.lo) if ci else None,
        f"{prefix}ci_hi": _scalar(result.hi) if ci else None,
    }


def _throughput(runs: list[Run]) -> dict[str, Any]:
    """Steps per hour and tokens per second of a group's runs, each summarised across seeds like the
    final values: the mean with its interval; `n_seeds` counts the runs with step times."""
    per_run = {
        "steps_per_hour": [_steps_per_hour(run) for run in runs],
        "tokens_per_s": [_tokens_per_s(run) for run in runs],
    }
    row: dict[str, Any] = {"n_seeds": sum(math.isfinite(v) for v in per_run["steps_per_hour"])}
    for name, values in per_run.items():
        result = curves.summarise(values)
        row |= {name: _scalar(result.mean), **_interval_fields(result, f"{name}_")}
    return row


@functools.cache
def _mean_lag(steps: int, sync_interval: int, sync_offset: int, offline: bool) -> float:
    return sum(staleness_lag(t, sync_interval, sync_offset, offline) for t in range(1, steps + 1)) / steps


def staleness_rank(config: dict[str, Any]) -> float:
    """How stale a run's data is, to order staleness settings from on-policy to the stalest: the
    mean lag its schedule gives over its steps (ALGORITHMS.md §6), or an async run's bound."""
    execution = config.get("execution", {})
    if execution.get("mode") == "async":
        return float(execution.get("max_staleness") or 0)
    s = config.get("staleness", {})
    return _mean_lag(
        int(config.get("steps", 1)),
        int(s.get("sync_interval", 1)),
        int(s.get("sync_offset", 0)),
        bool(s.get("offline", False)),
    )


PROVENANCE_CHECKS = {
    "theta0_sha256": "initial models (θ0)",
    "dataset_sha256": "datasets",
    "rlcore_version": "rlcore versions",
    "torch": "torch versions",
    "transformers": "transformers versions",
    "vllm": "vLLM versions",
}


def provenance_warnings(runs: list[Run]) -> list[str]:
    """What differs between the runs being aggregated that should not: θ0, data, library versions
    (from each run's provenance; runs that have not recorded one yet are not counted)."""
    warnings = []
    for key, what in PROVENANCE_CHECKS.items():
        values = {run.provenance.get(key) for run in runs if run.provenance}
        if len(values) > 1:
            shown = ", ".join(sorted(str(v)[:12] for v in values))
            warnings.append(
                f"These runs differ in their {what} ({shown}): their curves may not be comparable."
            )
    return warnings


def line_label(preset: str, experiment: Experiment, several: bool) -> str:
    """What a line is called: its preset, plus its experiment when runs of several are compared."""
    return f"{preset} · #{experiment.pk} {experiment.name}" if several else preset


def compare(runs: QuerySet[Run], query: ComparisonQuery) -> dict[str, Any]:
    """The comparison payload of `runs` (see the module docstring).

    A line is a preset within one experiment: runs of different experiments are never averaged
    together as seeds, since their configs may differ in more than preset and staleness.
    """
    runs = list(
        runs.select_related("experiment")
        .order_by("experiment_id", "pk")
        .annotate(
            **{
                f"last_{name}": Subquery(
                    MetricPoint.objects.filter(run=OuterRef("pk"), name=name)
                    .order_by("-step")
                    .values("value")[:1]
                )
                for name in SCATTER_METRICS
            },
            mean_step_s=_mean_of(STEP_TIME_METRIC),
            mean_tokens_per_s=_mean_of(TOKEN_RATE_METRIC),
        )
    )
    run_ids = [run.pk for run in runs]
    points = _points_by_run(run_ids, query.metric, with_time=query.x == "time")
    lengths = _points_by_run(run_ids, LENGTH_METRIC) if query.x == "tokens" else {}

    experiments = list({run.experiment_id: run.experiment for run in runs}.values())
    several = len(experiments) > 1
    presets = sorted({run.preset for run in runs}, key=preset_sort_key)
    first_of = {}
    for run in runs:
        first_of.setdefault(run.staleness, run)
    staleness = sorted(first_of, key=lambda label: (staleness_rank(first_of[label].config), label))
    lines = [
        {"line": line_label(preset, experiment, several), "preset": preset, "experiment": experiment.pk}
        for experiment in experiments
        for preset in presets
        if any(run.experiment_id == experiment.pk and run.preset == preset for run in runs)
    ]
    members: dict[tuple[int, str, str], list[Run]] = defaultdict(list)
    for run in runs:
        members[(run.experiment_id, run.preset, run.staleness)].append(run)

    groups, summary, throughput, run_rows = [], [], [], []
    finals_by_cell: dict[tuple[int, str, str], dict[int, float]] = {}
    for line in lines:
        for setting in staleness:
            group_runs = members.get((line["experiment"], line["preset"], setting), [])
            if not group_runs:
                continue
            key = {
                **line,
                "staleness": setting,
                "n_runs": len(group_runs),
                "active": any(run.is_active for run in group_runs),
            }
            series = {
                run.pk: _series(run, query, points[run.pk], lengths) for run in group_runs if run.pk in points
            }
            series = {pk: s for pk, s in series.items() if len(s)}
            # A bootstrap band over fewer than MIN_CI_SEEDS seeds is no CI: their min–max, said so.
            band = "minmax" if query.band == "ci" and len(series) < curves.MIN_CI_SEEDS else query.band
            full = curves.aggregate(list(series.values()), band)
            shown = curves.downsample(full)
            groups.append(
                {
                    **key,
                    "n_seeds": len(series),
                    "x": json_numbers(shown.x),
                    "mean": json_numbers(shown.mean),
                    "lo": None if shown.lo is None else json_numbers(shown.lo),
                    "hi": None if shown.hi is None else json_numbers(shown.hi),
                    "n": shown.n.tolist(),
                    "band": band,
                    "points": len(full.x),
                    "downsampled": len(shown.x) < len(full.x),
                }
            )
            finals = {pk: curves.final_value(s, query.rule, query.k) for pk, s in series.items()}
            result = curves.summarise(list(finals.values()))
            finals_by_cell[(line["experiment"], line["preset"], setting)] = {
                run.seed: finals[run.pk] for run in group_runs if run.pk in finals
            }
            summary.append(
                {
                    **key,
                    "n_seeds": result.n_seeds,
                    "n_active": sum(run.is_active for run in group_runs),
                    "value": _scalar(result.mean),
                    **_interval_fields(result),
                    "std": _scalar(result.std),
                    "n_collapsed": sum(bool(run.collapsed) for run in group_runs),
                }
            )
            throughput.append({**key, **_throughput(group_runs)})
            run_rows += [
                {
                    "id": run.pk,
                    **line,
                    "staleness": setting,
                    "seed": run.seed,
                    "status": run.status,
                    "collapsed": run.collapsed,
                    "collapsed_step": run.summary.get("collapsed_step"),
                    "final": _scalar(finals.get(run.pk, math.nan)),
                    **{name: getattr(run, f"last_{name}") for name in SCATTER_METRICS},
                    "steps_per_hour": _scalar(_steps_per_hour(run)),
                    "tokens_per_s": _scalar(_tokens_per_s(run)),
                }
                for run in group_runs
            ]
    mean_lags = {label: staleness_rank(first_of[label].config) for label in staleness}
    cell_runs = {
        cell: (sum(run.is_active for run in members_of), len(members_of))
        for cell, members_of in members.items()
    }
    return {
        "warnings": provenance_warnings(runs),
        "metric": query.metric,
        "x": query.x,
        "band": query.band,
        "rule": query.rule,
        "k": query.k,
        "delta": query.delta,
        "active": any(run.status in Run.ACTIVE for run in runs),
        "experiments": [{"id": e.pk, "name": e.name} for e in experiments],
        "presets": presets,
        "lines": lines,
        "staleness": staleness,
        "colours": preset_colours(presets),
        "groups": groups,
        "summary": summary,
        "throughput": throughput,
        "runs": run_rows,
        "digits": curves.decision_digits(query.delta),
        "min_ci_seeds": curves.MIN_CI_SEEDS,
        **staleness_answer(finals_by_cell, lines, staleness, mean_lags, query.delta, cell_runs),
    }


def _difference_row(d: curves.Difference) -> dict[str, Any]:
    return {"n_seeds": d.n_pairs, "value": _scalar(d.mean), **_interval_fields(d), "std": _scalar(d.std)}


def staleness_answer(
    finals: dict[tuple[int, str, str], dict[int, float]],
    lines: list[dict[str, Any]],
    staleness: list[str],
    mean_lags: dict[str, float],
    delta: float,
    cell_runs: dict[tuple[int, str, str], tuple[int, int]] | None = None,
) -> dict[str, Any]:
    """How much each line loses to staleness, and what the data say about the paper's claims.

    `drops`: per line and staleness setting, the final value minus the same line's on-policy final
    value, paired by seed, rounded as shown (`curves.decision_digits`: what every decision below
    compares with δ). `robustness`: per line, the mean and the worst drop over its staleness
    settings, its tolerance (the stalest setting up to which every drop's interval stays within δ
    below 0), its rank within its experiment by mean drop (lines missing a setting the experiment
    tested are not ranked), and `n_seeds` / `interval`: the fewest seed pairs those rest on and
    whether every one had a CI. `ties`: pairs of presets at one setting whose paired difference's
    interval contains 0, with the seeds per preset that would tell them apart. `findings`: per
    experiment, `findings.findings`; `cell_runs` (active, all runs per cell) makes them
    provisional while cells still run.
    """
    digits = curves.decision_digits(delta)
    cell_runs = cell_runs or {}

    def change(a, b) -> curves.Difference:
        return curves.paired_difference(a, b).rounded(digits)

    drops, robustness, ties, found = [], [], [], []
    for line in lines:
        cells = {
            s: finals[(line["experiment"], line["preset"], s)]
            for s in staleness
            if (line["experiment"], line["preset"], s) in finals
        }
        if findings.ON_POLICY not in cells:
            continue
        tested = [findings.ON_POLICY] + [s for s in staleness if s in cells and s != findings.ON_POLICY]
        changes = {s: change(cells[s], cells[findings.ON_POLICY]) for s in tested[1:]}
        drops += [{**line, "staleness": s, **_difference_row(d)} for s, d in changes.items()]
        means = [d.mean for d in changes.values() if math.isfinite(d.mean)]
        pairs = [d.n_pairs for d in changes.values()]
        robustness.append(
            {
                **line,
                "settings": list(changes),
                "mean_drop": _scalar(round(float(np.mean(means)), digits)) if means else None,
                "worst_drop": _scalar(min(means)) if means else None,
                "tolerance": curves.tolerance(tested, changes, delta),
                "rank": None,
                "n_seeds": min(pairs) if pairs else 0,
                "interval": curves.interval_kind(min(pairs)) if pairs else None,
            }
        )
    for experiment in dict.fromkeys(line["experiment"] for line in lines):
        rows = [r for r in robustness if r["experiment"] == experiment]
        every = {s for r in rows for s in r["settings"]}
        ranked = [r for r in rows if set(r["settings"]) == every and every and r["mean_drop"] is not None]
        for rank, row in enumerate(sorted(ranked, key=lambda r: -r["mean_drop"]), start=1):
            row["rank"] = rank
        presets = [line["preset"] for line in lines if line["experiment"] == experiment]
        for setting in staleness:
            for i, a in enumerate(presets):
                for b in presets[i + 1 :]:
                    if (experiment, a, setting) not in finals or (experiment, b, setting) not in finals:
                        continue
                    d = change(finals[(experiment, b, setting)], finals[(experiment, a, setting)])
                    if d.n_pairs and d.contains_zero():
                        ties.append(
                            {
                                "experiment": experiment,
                                "staleness": setting,
                                "a": a,
                                "b": b,
                                **_difference_row(d),
                                "seeds_needed": curves.seeds_needed(d),
                            }
                        )
        cells = {(p, s): v for (e, p, s), v in finals.items() if e == experiment}
        runs = {(p, s): counts for (e, p, s), counts in cell_runs.items() if e == experiment}
        tested = [s for s in staleness if any(key[1] == s for key in cells | runs)]
        evidence = findings.Evidence(cells, delta, digits, runs)
        found += [{"experiment": experiment, **f} for f in findings.findings(evidence, tested, mean_lags)]
    return {"drops": drops, "robustness": robustness, "ties": ties, "findings": found}


def curves_csv(payload: dict[str, Any]) -> str:
    """The aggregated curves as CSV: one row per group and grid point."""
    out = io.StringIO()
    writer = csv.writer(out)
    several = len(payload["experiments"]) > 1
    writer.writerow(
        [
            *(["experiment"] if several else []),
            "preset",
            "staleness",
            payload["x"],
            "mean",
            "lo",
            "hi",
            "n_seeds",
        ]
    )
    for g in payload["groups"]:
        lo, hi = g["lo"] or [None] * len(g["x"]), g["hi"] or [None] * len(g["x"])
        labels = [*([g["experiment"]] if several else []), g["preset"], g["staleness"]]
        for row in zip(g["x"], g["mean"], lo, hi, g["n"], strict=True):
            writer.writerow([*labels, *("" if v is None else v for v in row)])
    return out.getvalue()


def summary_csv(payload: dict[str, Any]) -> str:
    """The summary table as CSV: one row per (preset, staleness), the final value with its interval
    (`interval` says what `lo`, `hi` are: a 95% bootstrap CI, also in `ci_lo`/`ci_hi`, from
    `curves.MIN_CI_SEEDS` seeds, else the min–max), how many of its runs collapsed, and then the
    group's throughput (`throughput_n_seeds`: the runs with logged step times)."""
    out = io.StringIO()
    writer = csv.writer(out)
    several = len(payload["experiments"]) > 1
    columns = [
        *(["experiment"] if several else []),
        *("preset", "staleness", "n_runs", "n_seeds", "value", "lo", "hi", "interval", "ci_lo", "ci_hi"),
        *("std", "n_collapsed"),
    ]
    writer.writerow([*columns, *THROUGHPUT_COLUMNS, "throughput_n_seeds"])
    for row, speed in zip(payload["summary"], payload["throughput"], strict=True):
        values = [row[c] for c in columns] + [speed[c] for c in (*THROUGHPUT_COLUMNS, "n_seeds")]
        writer.writerow(["" if v is None else v for v in values])
    return out.getvalue()
