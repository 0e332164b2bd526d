"""Which compared runs go where (`Layout`): the runs, their experiments, presets, staleness cells
(ordered by the lag their runs trained at, `mean_lags`), varied fields and lines, and each cell's
runs; what the runs' provenance says differs (`provenance_warnings`)."""

from __future__ import annotations

import functools
import json
import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from django.db.models import QuerySet

from dashboards.comparison import throughput, variants
from experiments import series
from experiments.models import Experiment, MetricSummary, Run
from rlcore.presets import preset_sort_key
from rlcore.staleness import staleness as staleness_lag

SCATTER_METRICS = ("kl/init", "reward/mean")


STEP_TIME_METRIC = "time/step_s"


TOKEN_RATE_METRIC = "tokens_per_s"


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

    @functools.cached_property
    def costs(self) -> dict[int, throughput.Cost]:
        """Each run's measured rates and costs (`throughput.Cost`), by run id."""
        return {run.pk: throughput.Cost.of(run) for run in self.runs}

    @functools.cached_property
    def cell_runs(self) -> dict[tuple[int, str, str], tuple[int, int]]:
        """Per cell, (its runs still active, its runs that did not end early): a run that ended
        early is not one of its cell's runs for the findings, no value will come."""
        return {
            cell: (sum(run.is_active for run in members), sum(not run.ended_early for run in members))
            for cell, members in self.members.items()
        }

    def field_values(self) -> list[dict[str, Any]]:
        return variants.field_values(self.fields, self.runs, self.presets, self.staleness)
