"""The comparison's panels, by name (`PANELS`): each a function of the compared runs' layout, their
final values and the query, `(layout, finals, query) -> dict`, giving its keys of the payload;
`compare.compare` merges those asked for in this order (docs/architecture.md, "The comparison
dashboard")."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from dashboards.comparison import curves, payloads, statistics, throughput, variants
from dashboards.comparison.colours import PALETTE, preset_colours
from dashboards.comparison.drops import staleness_answer
from dashboards.comparison.grouping import SCATTER_METRICS, Layout, comparable_config, provenance_warnings
from dashboards.comparison.points import json_numbers
from dashboards.comparison.query import ComparisonQuery
from dashboards.comparison.reads import Finals, damage_warnings
from experiments.models import Run

Panel = Callable[[Layout, Finals, ComparisonQuery], dict[str, Any]]


def experiments(layout: Layout) -> list[dict[str, Any]]:
    return [{"id": e.pk, "name": e.name} for e in layout.experiments]


def frame(layout: Layout, finals: Finals, query: ComparisonQuery) -> dict[str, Any]:
    """What is compared and how: the query, the runs' warnings, experiments, presets, varied
    fields, lines, staleness cells with their lags, and the colours."""
    return {
        "warnings": provenance_warnings(layout.runs),
        "damaged": damage_warnings(finals.damaged),
        "metric": query.metric,
        "x": query.x,
        "band": query.band,
        "rule": query.rule,
        "k": query.k,
        "delta": query.delta,
        "active": any(run.status in Run.ACTIVE for run in layout.runs),
        "experiments": experiments(layout),
        "presets": layout.presets,
        "fields": layout.field_values(),
        "lines": layout.lines,
        "staleness": layout.staleness,
        "lags": layout.lags,
        "colours": preset_colours(layout.presets),
        "palette": PALETTE,
    }


def curves_panel(layout: Layout, finals: Finals, query: ComparisonQuery) -> dict[str, Any]:
    """Per cell, its runs' curves aggregated (mean, band, seeds per point) and downsampled."""
    points = finals.points or {}
    groups = []
    for _, _, key, group_runs in layout.cells():
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
    return {"groups": groups}


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


def summary(layout: Layout, finals: Finals, query: ComparisonQuery) -> dict[str, Any]:
    """The summary table: per cell the mean final value ± interval."""
    return {
        "summary": [
            _summary_row(key, group_runs, finals.runs[(line["experiment"], line["key"], setting)])
            for line, setting, key, group_runs in layout.cells()
        ]
    }


def throughput_panel(layout: Layout, finals: Finals, query: ComparisonQuery) -> dict[str, Any]:
    """Per cell, its runs' steady-state rates (`throughput.cell_throughput`)."""
    return {
        "throughput": [
            {**key, **throughput.cell_throughput(group_runs, layout.costs, query.contended)}
            for _, _, key, group_runs in layout.cells()
        ],
        "contended": query.contended,
    }


def speedups(layout: Layout, finals: Finals, query: ComparisonQuery) -> dict[str, Any]:
    """The speed-up readout (`throughput.speedups`)."""
    digits = curves.decision_digits(query.delta)
    return {
        "speedups": throughput.speedups(layout.runs, layout.costs, finals.by_run, query.contended, digits)
    }


def runs(layout: Layout, finals: Finals, query: ComparisonQuery) -> dict[str, Any]:
    """One row per run, cell by cell: its state, final value, last KL and reward, and rates."""
    return {
        "runs": [
            {
                "id": run.pk,
                **line,
                "staleness": setting,
                "seed": run.seed,
                "status": run.status,
                "collapsed": run.collapsed,
                "collapsed_step": run.summary.get("collapsed_step"),
                "final": curves.scalar(finals.by_run.get(run.pk, math.nan)),
                "ended_early": run.ended_early,
                "progress": run.progress,
                "steps": run.steps,
                **{name: getattr(run, f"last_{name}") for name in SCATTER_METRICS},
                "execution": run.execution_mode,
                "duration_s": run.duration_s,
                **throughput.run_fields(layout.costs[run.pk]),
            }
            for line, setting, _, group_runs in layout.cells()
            for run in group_runs
        ]
    }


def precision(layout: Layout, finals: Finals, query: ComparisonQuery) -> dict[str, Any]:
    """The digits every decision rounds to (`curves.decision_digits`), and the seeds a CI needs."""
    return {"digits": curves.decision_digits(query.delta), "min_ci_seeds": curves.MIN_CI_SEEDS}


def staleness(layout: Layout, finals: Finals, query: ComparisonQuery) -> dict[str, Any]:
    """Drops, robustness, ties, findings and borrowed baselines (`drops.staleness_answer`)."""
    return staleness_answer(
        finals.seeds,
        layout.lines,
        layout.staleness,
        {label: lag["mean_lag"] for label, lag in layout.lags.items()},
        query.delta,
        layout.cell_runs,
        {(run.experiment_id, run.line): comparable_config(run.config) for run in layout.runs},
    )


def contrasts(layout: Layout, finals: Finals, query: ComparisonQuery) -> dict[str, Any]:
    """Cells that differ in one varied field only, paired (`variants.contrasts`)."""
    return {
        "contrasts": variants.contrasts(
            finals.seeds, layout.lines, layout.staleness, layout.fields, query.delta, layout.cell_runs
        )
    }


def statistics_panel(layout: Layout, finals: Finals, query: ComparisonQuery) -> dict[str, Any]:
    """rliable's few-seed statistics of the final values (`kept_statistics`)."""
    panel = kept_statistics(finals.seeds, layout.lines, layout.staleness)
    return {"statistics": _with_cell_runs(panel, layout)}


def kept_statistics(
    seeds: dict[tuple[int, str, str], dict[int, float]], lines: list[dict[str, Any]], staleness: list[str]
) -> dict[str, Any]:
    """`statistics.panel` of the same inputs, kept with the payloads (`payloads.kept`): a dashboard
    polled while its runs go on is computed again at every new point, but its final values change
    only when a run logs a new one, and the bootstrap is most of the comparison's time. The key is
    everything `statistics.panel` reads (each cell's seeds and values, the lines' names, the settings)."""
    key = (
        "statistics",
        tuple(sorted((cell, tuple(sorted(values.items()))) for cell, values in seeds.items())),
        tuple((line["experiment"], line["key"], line["line"], line["variant_label"]) for line in lines),
        tuple(staleness),
    )
    return payloads.kept(key, lambda: statistics.panel(seeds, lines, staleness))


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


def noise(layout: Layout, finals: Finals, query: ComparisonQuery) -> dict[str, Any]:
    """The runs that ended early, and how noisy one run's final held-out accuracy is (`eval_noise`)."""
    return {
        "n_ended_early": sum(run.ended_early for run in layout.runs),
        "eval_noise": eval_noise(layout.runs, finals.by_run, query),
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


# The panels in the payload's order.
PANELS: dict[str, Panel] = {
    "frame": frame,
    "curves": curves_panel,
    "summary": summary,
    "throughput": throughput_panel,
    "speedups": speedups,
    "runs": runs,
    "precision": precision,
    "staleness": staleness,
    "contrasts": contrasts,
    "statistics": statistics_panel,
    "noise": noise,
}
