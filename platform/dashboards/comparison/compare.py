"""The comparison: one metric of the chosen runs, aggregated per (experiment, line, staleness)
group into curves with bands, final values and throughput across seeds, and the staleness answer
(each line's drop from its own on-policy runs, tolerance, ties, findings). A line is a preset and
its values of the sweep's other axes (`Run.variant`); `variants.contrasts` pairs the cells that
differ in one varied field only. How it is computed:
docs/architecture.md, "The comparison dashboard"."""

from __future__ import annotations

import colorsys
import functools
import json
import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from django.db.models import QuerySet

from dashboards.claims import templates, verdicts
from dashboards.comparison import curves, statistics, throughput, variants
from dashboards.comparison.points import json_numbers
from dashboards.comparison.query import ComparisonQuery
from experiments import packing, series
from experiments.models import Experiment, MetricSummary, Run
from rlcore.presets import preset_names, preset_sort_key
from rlcore.sinks import ASYNC_METRICS, EVAL_METRICS, MISMATCH_METRICS, STEP_METRICS
from rlcore.staleness import staleness as staleness_lag

METRICS = (*STEP_METRICS, *MISMATCH_METRICS, *ASYNC_METRICS, *EVAL_METRICS)


LENGTH_METRIC = "response_length/mean"


SCATTER_METRICS = ("kl/init", "reward/mean")


STEP_TIME_METRIC = "time/step_s"


TOKEN_RATE_METRIC = "tokens_per_s"


THROUGHPUT_COLUMNS = tuple(
    f"{name}{part}" for name in throughput.RATES for part in ("", "_lo", "_hi", "_interval")
)


# Colours for the lines of one chart, given in turn to the presets present (or a field's values):
# each at least 3:1 against white (WCAG's contrast for graphics) and every pair at least 22 apart in
# CIELAB (ΔE*76), so no two lines shown together look alike. Past 20, `colour` makes more.
PALETTE = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#9467bd",
    "#d55e00",
    "#8c564b",
    "#c71585",
    "#008080",
    "#b8860b",
    "#332288",
    "#882255",
    "#556b2f",
    "#1e90ff",
    "#800000",
    "#117733",
    "#2f4f4f",
    "#009e73",
    "#cc79a7",
    "#999933",
    "#8b4513",
)


def colour(index: int) -> str:
    """The `index`-th line colour: `PALETTE`, then hues a golden angle apart, dark enough for white."""
    if index < len(PALETTE):
        return PALETTE[index]
    hue = ((index - len(PALETTE)) * 137.508 + 15) % 360
    red, green, blue = colorsys.hls_to_rgb(hue / 360, 0.32, 0.75)
    return f"#{round(red * 255):02x}{round(green * 255):02x}{round(blue * 255):02x}"


def preset_colours(presets: list[str]) -> dict[str, str]:
    """A colour for each preset shown, given in turn to the presets present (in `rlcore.presets`
    order, then the others by name): no two alike, the same for the same runs (a permalink)."""
    known = {name: i for i, name in enumerate(preset_names())}
    ordered = sorted(set(presets), key=lambda p: (known.get(p, len(known)), p))
    return {p: colour(i) for i, p in enumerate(ordered)}


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


@functools.cache
def _mean_lag(steps: int, sync_interval: int, sync_offset: int, offline: bool) -> float:
    return sum(staleness_lag(t, sync_interval, sync_offset, offline) for t in range(1, steps + 1)) / steps


# The lag a step trained at: the mean over its batch's sequences (an async batch's parts may come
# from several versions); runs logged before that metric existed have the batch's oldest lag only.
LAG_METRIC, OLD_LAG_METRIC = "staleness/mean", "staleness"


def staleness_rank(config: dict[str, Any]) -> float:
    """How stale a run's data is by its config: the mean lag its schedule gives over its steps
    (docs/algorithms.md §6), or an async run's bound (its measured lag is `mean_lags`')."""
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


def mean_lags(runs: list[Run]) -> dict[str, dict[str, Any]]:
    """Per staleness cell label: `mean_lag`, the lag its runs trained at, mean over their steps
    (the schedule's, exact; an async cell's measured: the mean over its runs, of every compared
    experiment, of their logged `staleness/mean`, or its bound until one has logged a step),
    whether it was `measured`, and the async `bound`."""
    by_label: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_label[run.staleness].append(run)
    # Only async runs' lags are read (one query): a schedule's are known from its config.
    async_ids = [run.pk for run in runs if run.config.get("execution", {}).get("mode") == "async"]
    logged_lags: dict[tuple[int, str], float | None] = {
        (s.run_id, s.name): s.mean
        for s in MetricSummary.objects.filter(run_id__in=async_ids, name__in=(LAG_METRIC, OLD_LAG_METRIC))
    }
    out = {}
    for label, members in by_label.items():
        config = members[0].config
        if config.get("execution", {}).get("mode") != "async":
            out[label] = {"mean_lag": staleness_rank(config), "measured": False, "bound": None}
            continue
        lags = [
            logged_lags.get((run.pk, LAG_METRIC), logged_lags.get((run.pk, OLD_LAG_METRIC)))
            for run in members
        ]
        logged = [lag for lag in lags if lag is not None and math.isfinite(lag)]
        bound = staleness_rank(config)
        out[label] = {
            "mean_lag": float(np.mean(logged)) if logged else bound,
            "measured": bool(logged),
            "bound": int(bound),
        }
    return out


def comparable_config(config: dict[str, Any]) -> str:
    """A run's config without what a sweep varies (preset, staleness, execution, seed), as text:
    two experiments whose runs agree on it trained the same task, model, budget and optimiser."""
    rest = {k: v for k, v in config.items() if k not in ("staleness", "execution", "seed")}
    rest["algorithm"] = {k: v for k, v in rest.get("algorithm", {}).items() if k != "preset"}
    return json.dumps(rest, sort_keys=True)


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


def line_label(key: str, experiment: Experiment, several: bool) -> str:
    """What a line is called: its key, plus its experiment when runs of several are compared."""
    return f"{key} · #{experiment.pk} {experiment.name}" if several else key


@dataclass(frozen=True)
class Layout:
    """What the compared runs are and where each goes: `runs` (archived ones left out; each with
    its last KL and reward, mean step time and tokens per second from the summaries), their
    `experiments`, `presets` in site order, each staleness label's `lags` and the labels in order
    of staleness, the varied config `fields`, the `lines` (a preset and its variant, per
    experiment) and each cell's runs (`members`, by experiment, line key and staleness label)."""

    runs: list[Run]
    experiments: list[Experiment]
    presets: list[str]
    lags: dict[str, dict[str, Any]]
    staleness: list[str]
    fields: list[str]
    lines: list[dict[str, Any]]
    members: dict[tuple[int, str, str], list[Run]]

    @classmethod
    def of(cls, runs: QuerySet[Run]) -> Layout:
        listed = list(
            runs.filter(archived=None)
            .select_related("experiment")
            .order_by("experiment_id", "pk")
            .annotate(
                **{f"last_{name}": series.summary("last", name) for name in SCATTER_METRICS},
                mean_step_s=series.summary("mean", STEP_TIME_METRIC),
                mean_tokens_per_s=series.summary("mean", TOKEN_RATE_METRIC),
            )
        )
        experiments = list({run.experiment_id: run.experiment for run in listed}.values())
        several = len(experiments) > 1
        presets = sorted({run.preset for run in listed}, key=preset_sort_key)
        lags = mean_lags(listed)
        members: dict[tuple[int, str, str], list[Run]] = defaultdict(list)
        for run in listed:
            members[(run.experiment_id, run.line, run.staleness)].append(run)
        return cls(
            runs=listed,
            experiments=experiments,
            presets=presets,
            lags=lags,
            staleness=sorted(lags, key=lambda label: (lags[label]["mean_lag"], label)),
            fields=variants.varied_fields(listed),
            lines=variants.lines(listed, experiments, presets, lambda k, e: line_label(k, e, several)),
            members=dict(members),
        )

    def cells(self) -> Iterator[tuple[dict[str, Any], str, dict[str, Any], list[Run]]]:
        """Each cell with runs in the page's order (line, then staleness): its line, staleness
        label, the fields that name it in every table (`key`) and its runs."""
        for line in self.lines:
            for setting in self.staleness:
                group_runs = self.members.get((line["experiment"], line["key"], setting), [])
                if group_runs:
                    yield (
                        line,
                        setting,
                        {
                            **line,
                            "staleness": setting,
                            "n_runs": len(group_runs),
                            "active": any(run.is_active for run in group_runs),
                        },
                        group_runs,
                    )

    def field_values(self) -> list[dict[str, Any]]:
        return variants.field_values(self.fields, self.runs, self.presets, self.staleness)


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


def _summary_row(key: dict[str, Any], group_runs: list[Run], finals: dict[int, float]) -> dict[str, Any]:
    """A cell's row of the summary table: the mean of its runs' final values with its interval,
    how many of its runs are still going (`n_active`: the value is partial) and how many ended
    early (`n_ended_early`: left out, `Run.ended_early`)."""
    result = curves.summarise(list(finals.values()))
    return {
        **key,
        "n_seeds": result.n_seeds,
        "n_active": sum(run.is_active for run in group_runs),
        "n_ended_early": sum(run.ended_early for run in group_runs),
        "value": curves.scalar(result.mean),
        **curves.interval_fields(result),
        "std": curves.scalar(result.std),
        "n_collapsed": sum(bool(run.collapsed) for run in group_runs),
    }


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


def summary_table(runs: QuerySet[Run], query: ComparisonQuery) -> dict[str, Any]:
    """The summary table alone, as `compare` gives it (`summary`, `throughput`, with the
    `experiments` and varied `fields` its CSV names): per cell the final value ± interval and the
    throughput. The final values come from the summaries (`stored_finals`) and the points are
    read only when the query needs them."""
    layout = Layout.of(runs)
    finals = final_values(layout.runs, query)
    costs = {run.pk: throughput.Cost.of(run) for run in layout.runs}
    summary, rates = [], []
    for _, _, key, group_runs in layout.cells():
        summary.append(
            _summary_row(key, group_runs, {r.pk: finals[r.pk] for r in group_runs if r.pk in finals})
        )
        rates.append({**key, **throughput.cell_throughput(group_runs, costs, query.contended)})
    return {
        "experiments": [{"id": e.pk, "name": e.name} for e in layout.experiments],
        "fields": layout.field_values(),
        "summary": summary,
        "throughput": rates,
    }


def compare(runs: QuerySet[Run], query: ComparisonQuery) -> dict[str, Any]:
    """The comparison payload of `runs` (see the module docstring).

    A line is a preset within one experiment: runs of different experiments are never averaged
    together as seeds, since their configs may differ in more than preset and staleness.
    Archived runs are left out. Final values come from the summaries where the query allows
    (`final_values`), else from the points. The points and the summaries are two reads: a run
    that logs in between shows its new point in its final value and not yet in its curve, until
    the next call (its state, the kept answer's key, changed with that point).
    """
    layout = Layout.of(runs)
    runs, lines, staleness, lags = layout.runs, layout.lines, layout.staleness, layout.lags
    damaged: list[series.Damage] = []
    points = _points(runs, query, damaged)
    every_final = final_values(runs, query, points)

    costs = {run.pk: throughput.Cost.of(run) for run in runs}
    groups, summary, rates, run_rows = [], [], [], []
    finals_by_cell: dict[tuple[int, str, str], dict[int, float]] = {}
    finals_by_run: dict[int, float] = {}
    for line, setting, key, group_runs in layout.cells():
        seeds = {run.pk: points[run.pk] for run in group_runs if run.pk in points}
        # A bootstrap band over fewer than MIN_CI_SEEDS seeds is no CI: their min–max, said so.
        band = "minmax" if query.band == "ci" and len(seeds) < curves.MIN_CI_SEEDS else query.band
        full = curves.aggregate(list(seeds.values()), band)
        shown = curves.downsample(full)
        groups.append(
            {
                **key,
                "n_seeds": len(seeds),
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
        finals = {
            run.pk: every_final.get(run.pk, math.nan)
            for run in group_runs
            if run.pk in seeds and not run.ended_early
        }
        finals_by_run |= finals
        finals_by_cell[(line["experiment"], line["key"], setting)] = {
            run.seed: finals[run.pk] for run in group_runs if run.pk in finals
        }
        summary.append(_summary_row(key, group_runs, finals))
        rates.append({**key, **throughput.cell_throughput(group_runs, costs, query.contended)})
        run_rows += [
            {
                "id": run.pk,
                **line,
                "staleness": setting,
                "seed": run.seed,
                "status": run.status,
                "collapsed": run.collapsed,
                "collapsed_step": run.summary.get("collapsed_step"),
                "final": curves.scalar(finals.get(run.pk, math.nan)),
                "ended_early": run.ended_early,
                "progress": run.progress,
                "steps": run.steps,
                **{name: getattr(run, f"last_{name}") for name in SCATTER_METRICS},
                "execution": run.execution_mode,
                "duration_s": run.duration_s,
                **throughput.run_fields(costs[run.pk]),
            }
            for run in group_runs
        ]
    # A run that ended early is not one of its cell's runs for the findings: no value will come.
    cell_runs = {
        cell: (sum(run.is_active for run in members_of), sum(not run.ended_early for run in members_of))
        for cell, members_of in layout.members.items()
    }
    return {
        "warnings": provenance_warnings(runs),
        "damaged": damage_warnings(damaged),
        "metric": query.metric,
        "x": query.x,
        "band": query.band,
        "rule": query.rule,
        "k": query.k,
        "delta": query.delta,
        "active": any(run.status in Run.ACTIVE for run in runs),
        "experiments": [{"id": e.pk, "name": e.name} for e in layout.experiments],
        "presets": layout.presets,
        "fields": layout.field_values(),
        "lines": lines,
        "staleness": staleness,
        "lags": lags,
        "colours": preset_colours(layout.presets),
        "palette": PALETTE,
        "groups": groups,
        "summary": summary,
        "throughput": rates,
        "contended": query.contended,
        "speedups": throughput.speedups(
            runs, costs, finals_by_run, query.contended, curves.decision_digits(query.delta)
        ),
        "runs": run_rows,
        "digits": curves.decision_digits(query.delta),
        "min_ci_seeds": curves.MIN_CI_SEEDS,
        **staleness_answer(
            finals_by_cell,
            lines,
            staleness,
            {label: lag["mean_lag"] for label, lag in lags.items()},
            query.delta,
            cell_runs,
            {(run.experiment_id, run.line): comparable_config(run.config) for run in runs},
        ),
        "contrasts": variants.contrasts(
            finals_by_cell, lines, staleness, layout.fields, query.delta, cell_runs
        ),
        "statistics": _with_cell_runs(statistics.cached_panel(finals_by_cell, lines, staleness), layout),
        "n_ended_early": sum(run.ended_early for run in runs),
        "eval_noise": eval_noise(runs, finals_by_run, query),
    }


def eval_noise(runs: list[Run], finals: dict[int, float], query: ComparisonQuery) -> dict[str, Any] | None:
    """How noisy one run's final held-out accuracy is: the binomial standard error of an evaluation
    of `eval_size` prompts at the runs' mean final accuracy, √(p(1 − p)/n), for the rules that read
    evaluations one at a time (last, best) or k of them (mean of the last k: /√k); beside δ, with
    `exceeds_delta` when it is larger (one evaluation then cannot resolve δ: the mean of the last k
    or the AUC is smoother). None for other metrics and rules, or without a final value."""
    if query.metric != "eval/accuracy" or query.rule not in ("last", "best", "mean_last_k"):
        return None
    values = [v for v in (finals.get(run.pk) for run in runs) if v is not None and math.isfinite(v)]
    sizes = [int(run.config.get("eval_size") or 0) for run in runs]
    size = min((n for n in sizes if n > 0), default=0)
    if not values or not size:
        return None
    accuracy = min(1.0, max(0.0, sum(values) / len(values)))
    # A run evaluates at step 0 and every `eval_every` steps: the last k reach back that far only.
    logged = min(
        int(r.config.get("steps", 1)) // max(1, int(r.config.get("eval_every") or 1)) + 1 for r in runs
    )
    evaluations = min(query.k, logged) if query.rule == "mean_last_k" else 1
    error = math.sqrt(accuracy * (1 - accuracy) / size / evaluations)
    return {
        "eval_size": size,
        "accuracy": accuracy,
        "evaluations": evaluations,
        "standard_error": error,
        "exceeds_delta": error > query.delta,
    }


def _with_cell_runs(panel: dict[str, Any], layout: Layout) -> dict[str, Any]:
    """The statistics panel with each cell's runs that ended early (`n_ended_early`), left out of
    its scores as of every final value, and those still queued or running (`n_active`), whose
    value so far is in its scores: the cell is provisional."""
    keys = {(line["experiment"], line["line"]): line["key"] for line in layout.lines}
    for cell in panel["cells"]:
        key = keys[(cell["experiment"], cell["line"])]
        members = layout.members.get((cell["experiment"], key, cell["staleness"]), [])
        cell["n_ended_early"] = sum(run.ended_early for run in members)
        cell["n_active"] = sum(run.is_active for run in members)
    return panel


def staleness_answer(
    finals: dict[tuple[int, str, str], dict[int, float]],
    lines: list[dict[str, Any]],
    staleness: list[str],
    mean_lags: dict[str, float],
    delta: float,
    cell_runs: dict[tuple[int, str, str], tuple[int, int]] | None = None,
    configs: dict[tuple[int, str], str] | None = None,
) -> dict[str, Any]:
    """How much each line loses to staleness, and what the data say about the paper's claims.

    `drops`: per line and staleness cell (schedules and async cells alike), the final value minus
    the same line's on-policy final value (`baseline`: its cell, on-policy or on-policy
    (distributed), and its experiment: another compared one's when the line has none, `borrowed`),
    paired by seed, rounded as shown (`curves.decision_digits`: what every decision below
    compares with δ). `robustness`: per line, the mean and the worst drop over its staleness
    settings, its tolerance (the stalest setting up to which every drop's interval stays within δ
    below 0), its rank within its experiment by mean drop (lines missing a setting the experiment
    tested are not ranked), and `n_seeds` / `interval`: the fewest seed pairs those rest on and
    whether every one had a CI. `ties`: pairs of presets at one setting whose paired difference's
    interval contains 0, with the seeds per preset that would tell them apart. `findings`: per
    experiment, `templates.findings`; `cell_runs` (active, all runs per cell) makes them
    provisional while cells still run; `findings_left_out`: the templates whose presets the
    experiment's variant never ran.
    """
    digits = curves.decision_digits(delta)
    cell_runs = cell_runs or {}

    def change(a, b) -> curves.Difference:
        return curves.paired_difference(a, b).rounded(digits)

    own, finals = finals, dict(finals)
    borrowed = _borrow_baselines(finals, lines, staleness, configs or {})
    drops, robustness, ties, found, left_out = [], [], [], [], []
    for line in lines:
        cells = {
            s: finals[(line["experiment"], line["key"], s)]
            for s in staleness
            if (line["experiment"], line["key"], s) in finals
        }
        on_policy = templates.baseline(cells)
        if on_policy is None:
            continue
        baseline = {"staleness": on_policy, "experiment": borrowed.get((line["experiment"], line["key"]))}
        baseline["experiment"] = baseline["experiment"] or line["experiment"]
        tested = [on_policy] + [s for s in staleness if s in cells and s != on_policy]
        changes = {s: change(cells[s], cells[on_policy]) for s in tested[1:]}
        drops += [
            {**line, "staleness": s, "baseline": baseline, **curves.difference_fields(d)}
            for s, d in changes.items()
        ]
        means = [d.mean for d in changes.values() if math.isfinite(d.mean)]
        pairs = [d.n_pairs for d in changes.values()]
        robustness.append(
            {
                **line,
                "baseline": baseline,
                "settings": list(changes),
                "mean_drop": curves.scalar(round(float(np.mean(means)), digits)) if means else None,
                "worst_drop": curves.scalar(min(means)) if means else None,
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
        # Equal mean changes (as shown) share a rank, the next one skipping: 1, 1, 3.
        ordered = sorted(ranked, key=lambda r: -r["mean_drop"])
        for place, row in enumerate(ordered, start=1):
            tied = place > 1 and row["mean_drop"] == ordered[place - 2]["mean_drop"]
            row["rank"] = ordered[place - 2]["rank"] if tied else place
        # Ties and the paper's claims compare presets within one variant (the other axes held fixed).
        for variant in dict.fromkeys(
            line["variant_label"] for line in lines if line["experiment"] == experiment
        ):
            group = [
                line
                for line in lines
                if line["experiment"] == experiment and line["variant_label"] == variant
            ]
            keys = {line["key"]: line["preset"] for line in group}
            for setting in staleness:
                for i, a in enumerate(group):
                    for b in group[i + 1 :]:
                        ka, kb = (experiment, a["key"], setting), (experiment, b["key"], setting)
                        if ka not in own or kb not in own:
                            continue
                        d = change(own[kb], own[ka])
                        if d.n_pairs and d.contains_zero():
                            ties.append(
                                {
                                    "experiment": experiment,
                                    "variant": variant,
                                    "staleness": setting,
                                    "a": a["preset"],
                                    "b": b["preset"],
                                    **curves.difference_fields(d),
                                    "seeds_needed": curves.seeds_needed(d),
                                }
                            )
            cells = {(keys[k], s): v for (e, k, s), v in finals.items() if e == experiment and k in keys}
            runs = {(keys[k], s): n for (e, k, s), n in cell_runs.items() if e == experiment and k in keys}
            tested = [s for s in staleness if any(key[1] == s for key in cells | runs)]
            on_policy = templates.baseline({s for _, s in cells}) or templates.ON_POLICY
            evidence = verdicts.Data(cells, runs, on_policy, digits)
            checked, skipped = templates.findings(evidence, tested, mean_lags, delta, set(keys.values()))
            found += [{"experiment": experiment, "variant": variant, **f} for f in checked]
            left_out += [{"experiment": experiment, "variant": variant, **f} for f in skipped]
    return {
        "drops": drops,
        "robustness": robustness,
        "ties": ties,
        "findings": found,
        "findings_left_out": left_out,
        "borrowed": [
            {"experiment": e, "preset": k, "from_experiment": source} for (e, k), source in borrowed.items()
        ],
    }


def _borrow_baselines(
    finals: dict[tuple[int, str, str], dict[int, float]],
    lines: list[dict[str, Any]],
    staleness: list[str],
    configs: dict[tuple[int, str], str],
) -> dict[tuple[int, str], int]:
    """Lines of several compared experiments that have stale cells but no on-policy runs take those of
    the same line (preset and variant) from the first other experiment that has them and runs the same
    config apart from preset, staleness, execution and seed (`configs`: (experiment, line key) → that
    config, as text), paired by seed like their own: added to `finals` under the line's own
    experiment; returns (experiment, line key) → the lender."""
    borrowed = {}
    for line in lines:
        experiment, preset = line["experiment"], line["key"]
        own = [s for s in staleness if (experiment, preset, s) in finals]
        if not own or templates.baseline(own) is not None:
            continue
        for other in lines:
            if other["key"] != preset or other["experiment"] == experiment:
                continue
            if configs.get((other["experiment"], preset)) != configs.get((experiment, preset)):
                continue  # another task, model, budget or optimiser: no baseline for this line
            lent = templates.baseline([s for s in staleness if (other["experiment"], preset, s) in finals])
            if lent is not None and (other["experiment"], preset) not in borrowed:
                finals[(experiment, preset, lent)] = finals[(other["experiment"], preset, lent)]
                borrowed[(experiment, preset)] = other["experiment"]
                break
    return borrowed
