"""Throughput a team can trust, and the speed-up readout: each run's steady-state rates and costs
from what its worker measured (`workers.measure`: the run's summary), contended runs left out
unless asked for, and for each async or distributed cell its wall-clock and CPU cost against the
matching simulated cell, paired by seed, beside the accuracy it gave up (docs/architecture.md,
"Throughput and the speed-up readout")."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dashboards.comparison import curves
from experiments.models import Run


def _number(value: Any) -> float:
    """A measured value as a float, NaN where it is not a finite number (not measured)."""
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else math.nan


@dataclass(frozen=True)
class Cost:
    """One run's measured rates (NaN where unknown). Runs stored before runs were measured have
    only their logged step times: `measured` is False and the rates come from those."""

    measured: bool
    contended: bool | None  # None: not known (not measured, or no /proc on its machine)
    others_cores: float
    steps_per_hour: float  # steady state: steps after the first, over their wall-clock
    tokens_per_s: float
    tokens_per_cpu_s: float  # steady tokens per CPU second of the trainer and its rollout jobs
    cold_start_s: float  # start-up and θ0 warm start, before the first step
    first_step_s: float
    wall_per_step_s: float  # wall-clock per steady step, its evaluations and checkpoints included
    cpu_per_step_s: float  # CPU seconds per steady step, likewise
    attempt_s: float
    threads: float

    @classmethod
    def of(cls, run: Run) -> Cost:
        m = run.measured
        steady_s, steps = _number(m.time_steady_s), _number(m.steps_steady)
        if not math.isfinite(steady_s):
            mean_step_s = getattr(run, "mean_step_s", None)
            mean_tokens = getattr(run, "mean_tokens_per_s", None)
            unknown = dict.fromkeys(
                ("others_cores", "tokens_per_cpu_s", "cold_start_s", "first_step_s"), math.nan
            )
            unknown |= dict.fromkeys(("wall_per_step_s", "cpu_per_step_s", "attempt_s", "threads"), math.nan)
            return cls(
                measured=False,
                contended=None,
                steps_per_hour=3600.0 / mean_step_s if mean_step_s else math.nan,
                tokens_per_s=math.nan if mean_tokens is None else float(mean_tokens),
                **unknown,
            )
        per_step = steps if steps > 0 else math.nan
        steady_wall = steady_s + _number(m.time_eval_steady_s) + _number(m.time_checkpoint_steady_s)
        steady_cpu = _number(m.cpu_trainer_steady_s) + _number(m.cpu_rollout_steady_s)
        tokens = _number(m.tokens_steady)
        return cls(
            measured=True,
            contended=m.contended,
            others_cores=_number(m.machine_others_cores),
            steps_per_hour=3600.0 * per_step / steady_s if steady_s > 0 else math.nan,
            tokens_per_s=tokens / steady_s if steady_s > 0 else math.nan,
            tokens_per_cpu_s=tokens / steady_cpu if steady_cpu > 0 else math.nan,
            cold_start_s=_number(m.time_startup_s) + _number(m.time_warm_start_s),
            first_step_s=_number(m.time_first_step_s),
            wall_per_step_s=steady_wall / per_step,
            cpu_per_step_s=steady_cpu / per_step,
            attempt_s=_number(m.time_attempt_s),
            threads=_number(m.threads_trainer),
        )

    def counts(self, include_contended: bool) -> bool:
        """Whether the run's rates count in throughput comparisons."""
        return include_contended or not self.contended


RATES = ("steps_per_hour", "tokens_per_s", "tokens_per_cpu_s", "cold_start_s")


def _summary_fields(values: list[float], name: str) -> dict[str, Any]:
    result = curves.summarise(values)
    return {name: curves.scalar(result.mean), **curves.interval_fields(result, f"{name}_")}


def cell_throughput(runs: list[Run], costs: Mapping[int, Cost], include_contended: bool) -> dict[str, Any]:
    """A cell's rates across seeds, each the mean with its interval (`<rate>_n`: the runs it rests
    on), from the ended runs that count: `n_seeds` of them; `n_contended` left out as contended,
    `n_active` still queued or running (measured once they end), `n_ended_early` left out as
    ended before their last step (`Run.ended_early`), `n_unmeasured` ended with logged step times
    only (stored before runs were measured, or failed)."""
    ended = [run for run in runs if run.status not in Run.ACTIVE and not run.ended_early]
    counted = [costs[run.pk] for run in ended if costs[run.pk].counts(include_contended)]
    row: dict[str, Any] = {
        "n_seeds": sum(math.isfinite(c.steps_per_hour) for c in counted),
        "n_contended": sum(bool(costs[run.pk].contended) for run in ended),
        "n_active": sum(run.is_active for run in runs),
        "n_ended_early": sum(run.ended_early for run in runs),
        "n_unmeasured": sum(not costs[run.pk].measured for run in ended),
    }
    for name in RATES:
        values = [getattr(c, name) for c in counted]
        row |= _summary_fields(values, name) | {f"{name}_n": sum(math.isfinite(v) for v in values)}
    return row


def run_fields(cost: Cost) -> dict[str, Any]:
    """What the runs table shows of a run's measurement."""
    return {
        "measured": cost.measured,
        "contended": cost.contended,
        "others_cores": curves.scalar(cost.others_cores),
        "steps_per_hour": curves.scalar(cost.steps_per_hour),
        "tokens_per_s": curves.scalar(cost.tokens_per_s),
        "tokens_per_cpu_s": curves.scalar(cost.tokens_per_cpu_s),
        "cold_start_s": curves.scalar(cost.cold_start_s),
        "first_step_s": curves.scalar(cost.first_step_s),
    }


def references(config: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The simulated cells a distributed or async cell is measured against, as (what, the
    reference's staleness section): an async ≤ k cell against `sync_offset: k` (the schedule with
    the same bound) and against on-policy; a distributed cell against its own schedule."""
    execution = config.get("execution", {})
    mode = execution.get("mode", "simulated")
    if mode == "async":
        k = int(execution.get("max_staleness") or 0)
        schedule = {"sync_offset": k} if k else {}
        out = [("the same bound", schedule)]
        return out + ([("on-policy", {})] if k else [])
    if mode == "distributed":
        return [("its own schedule", dict(config.get("staleness", {})))]
    return []


def _schedule_key(staleness: Mapping[str, Any]) -> tuple[int, int, bool]:
    return (
        int(staleness.get("sync_interval", 1)),
        int(staleness.get("sync_offset", 0)),
        bool(staleness.get("offline", False)),
    )


def _geometric(d: curves.Difference) -> dict[str, Any]:
    """A paired difference of logs as a ratio: exp of its mean and bounds."""
    return {
        "value": curves.scalar(math.exp(d.mean)) if math.isfinite(d.mean) else None,
        "lo": curves.scalar(math.exp(d.lo)) if math.isfinite(d.lo) else None,
        "hi": curves.scalar(math.exp(d.hi)) if math.isfinite(d.hi) else None,
        "interval": curves.interval_kind(d.n_pairs) if d.n_pairs else None,
        "n_pairs": d.n_pairs,
    }


Pairs = Mapping[int, tuple[Run, Run]]  # seed → (the cell's run, the reference's)


def _logs(pairs: Pairs, costs: Mapping[int, Cost], index: int, field: str) -> dict[int, float]:
    """log of `field` of one side of each pair (NaN where it is not a positive number)."""
    values = {seed: getattr(costs[pair[index].pk], field) for seed, pair in pairs.items()}
    return {seed: math.log(v) if v > 0 else math.nan for seed, v in values.items()}


def _mean(pairs: Pairs, costs: Mapping[int, Cost], index: int, field: str) -> float | None:
    if not pairs:
        return None
    return curves.scalar(float(np.mean([getattr(costs[pair[index].pk], field) for pair in pairs.values()])))


def _outside_load(pairs: Mapping[int, tuple[Run, Run]], costs: Mapping[int, Cost], side: int) -> float | None:
    """The mean of the cores other processes used while one side's measured runs of `pairs` ran
    (None if none was measured): a drift in outside load between the cells shows beside their ratio."""
    cores = [costs[pair[side].pk].others_cores for pair in pairs.values()]
    cores = [c for c in cores if math.isfinite(c)]
    return sum(cores) / len(cores) if cores else None


def speedups(
    runs: list[Run],
    costs: Mapping[int, Cost],
    finals: Mapping[int, float],
    include_contended: bool,
    digits: int,
) -> list[dict[str, Any]]:
    """Per experiment, preset and distributed or async cell, per reference cell (`references`) of
    the same experiment and preset: `speedup`, the reference's wall-clock per steady step over the
    cell's (above 1: the cell is faster), and `cpu_cost`, the cell's CPU seconds per steady step
    over the reference's, each the geometric mean over seed pairs with its interval (95% bootstrap
    CI from 5 pairs, min–max below); `accuracy_change`, the cell's final value minus the
    reference's, paired by seed and rounded to `digits` like every drop. Only measured runs that
    completed their steps (not `Run.ended_early`) and count (`Cost.counts`) are paired;
    `n_left_out` says how many runs of the two cells were not, `n_active` and `n_ended_early` how
    many of those are still going or ended early; `others_cores` / `reference_others_cores` the
    mean cores other processes used while each side's runs ran."""
    simulated: dict[tuple[int, str, tuple], dict[int, Run]] = {}
    cells: dict[tuple[int, str, str], list[Run]] = {}
    for run in runs:
        mode = run.config.get("execution", {}).get("mode", "simulated")
        if mode == "simulated":
            key = (run.experiment_id, run.line, _schedule_key(run.config.get("staleness", {})))
            simulated.setdefault(key, {})[run.seed] = run
        else:
            cells.setdefault((run.experiment_id, run.line, run.staleness), []).append(run)

    def usable(run: Run) -> bool:
        cost = costs[run.pk]
        finished = run.status not in Run.ACTIVE and not run.ended_early
        return (
            finished
            and cost.measured
            and cost.counts(include_contended)
            and math.isfinite(cost.wall_per_step_s)
        )

    rows = []
    for (experiment, preset, label), members in cells.items():
        for what, staleness in references(members[0].config):
            reference = simulated.get((experiment, preset, _schedule_key(staleness)))
            if not reference:
                continue
            pairs = {r.seed: (r, reference[r.seed]) for r in members if r.seed in reference}
            good = {seed: pair for seed, pair in pairs.items() if usable(pair[0]) and usable(pair[1])}
            ref_label = next(iter(reference.values())).staleness

            wall = curves.paired_difference(
                _logs(good, costs, 1, "wall_per_step_s"), _logs(good, costs, 0, "wall_per_step_s")
            )
            cpu = curves.paired_difference(
                _logs(good, costs, 0, "cpu_per_step_s"), _logs(good, costs, 1, "cpu_per_step_s")
            )
            accuracy = curves.paired_difference(
                {seed: finals.get(pair[0].pk, math.nan) for seed, pair in good.items()},
                {seed: finals.get(pair[1].pk, math.nan) for seed, pair in good.items()},
            ).rounded(digits)
            rows.append(
                {
                    "experiment": experiment,
                    "preset": members[0].preset,
                    "line": preset,
                    "staleness": label,
                    "reference": ref_label,
                    "against": what,
                    "speedup": _geometric(wall),
                    "cpu_cost": _geometric(cpu),
                    "accuracy_change": {
                        "value": curves.scalar(accuracy.mean),
                        "lo": curves.scalar(accuracy.lo),
                        "hi": curves.scalar(accuracy.hi),
                        "interval": accuracy.interval,
                        "n_pairs": accuracy.n_pairs,
                    },
                    "wall_per_step_s": _mean(good, costs, 0, "wall_per_step_s"),
                    "reference_wall_per_step_s": _mean(good, costs, 1, "wall_per_step_s"),
                    "n_pairs": len(good),
                    "others_cores": _outside_load(pairs, costs, 0),
                    "reference_others_cores": _outside_load(pairs, costs, 1),
                    "n_left_out": sum(not usable(r) for pair in pairs.values() for r in pair),
                    "n_active": sum(r.status in Run.ACTIVE for pair in pairs.values() for r in pair),
                    "n_ended_early": sum(r.ended_early for pair in pairs.values() for r in pair),
                }
            )
    return rows
