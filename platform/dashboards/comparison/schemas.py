"""The comparison payload as the API documents it: every field `dashboards.comparison.compare.compare`
returns (the API test checks the API's answer against the dashboard's JSON, so a field left out
here would show)."""

from __future__ import annotations

from typing import Any

from ninja import Field, Schema
from pydantic import ConfigDict

from dashboards.claims.schemas import FindingLeftOutOut, FindingOut

Numbers = list[int | float | None]


class LineOut(Schema):
    line: str = Field(
        description="the preset with its variant, plus its experiment when runs of several are compared"
    )
    key: str = Field(description="the line within its experiment: the preset · its variant label")
    preset: str
    variant: dict[str, Any] = Field(
        description="its values of the sweep's axes besides presets, staleness and seeds (config field → value)"
    )
    variant_label: str = Field(description='the variant as text, e.g. "minibatches=4" ("" if none)')
    experiment: int


INTERVAL_HELP = (
    "what lo and hi are: 95% bootstrap CI (from 5 seeds on), min–max (2 to 4 seeds), or null (one seed)"
)


class IntervalOut(Schema):
    lo: float | None = Field(description="lower end of the interval (see interval)")
    hi: float | None
    interval: str | None = Field(description=INTERVAL_HELP)
    ci_lo: float | None = Field(description="lo when the interval is a 95% bootstrap CI, else null")
    ci_hi: float | None


class CellOut(LineOut):
    staleness: str
    n_runs: int
    active: bool = Field(description="some run of the cell is queued or running")


class GroupOut(CellOut):
    n_seeds: int = Field(description="runs with points of the metric")
    x: Numbers
    mean: Numbers
    lo: Numbers | None = Field(description="lower edge of the band; null for band=none")
    hi: Numbers | None
    n: list[int] = Field(description="seeds behind each point")
    band: str = Field(
        description="the band drawn: the one asked for, except ci below 5 seeds, drawn as minmax"
    )
    points: int = Field(description="points on the common grid before downsampling")
    downsampled: bool


class FinalValueOut(CellOut, IntervalOut):
    n_seeds: int
    n_active: int = Field(description="runs of the cell still queued or running (their value is partial)")
    n_ended_early: int = Field(
        description="runs of the cell that failed, were cancelled or were lost before their last step "
        "(Run.ended_early): no finished seed, left out of the value"
    )
    value: float | None = Field(description="mean over seeds of each run's final value (`rule`)")
    std: float | None
    n_collapsed: int = Field(description="runs of the cell whose policy collapsed (experiments.collapse)")


class ThroughputOut(CellOut):
    n_seeds: int = Field(
        description="runs whose rates count: measured or with logged step times, not contended"
    )
    n_contended: int = Field(
        description="runs that ran contended (other processes busy on their machine): left out unless contended=1"
    )
    n_active: int = Field(description="runs still queued or running: their rates count once they end")
    n_ended_early: int = Field(
        description="runs that failed, were cancelled or were lost before their last step: left out"
    )
    n_unmeasured: int = Field(
        description="ended runs without a measurement (stored before runs were measured, or failed): rates from "
        "their logged step times"
    )
    steps_per_hour: float | None = Field(
        description="steady-state trainer steps per hour: the steps after the first over their wall-clock (runs measured before this was recorded: 3600 / their mean logged step time)"
    )
    steps_per_hour_lo: float | None
    steps_per_hour_hi: float | None
    steps_per_hour_interval: str | None = Field(description=INTERVAL_HELP)
    steps_per_hour_ci_lo: float | None
    steps_per_hour_ci_hi: float | None
    steps_per_hour_n: int = Field(description="runs this rate rests on")
    tokens_per_s: float | None = Field(description="steady-state response tokens trained per second")
    tokens_per_s_lo: float | None
    tokens_per_s_hi: float | None
    tokens_per_s_interval: str | None = Field(description=INTERVAL_HELP)
    tokens_per_s_ci_lo: float | None
    tokens_per_s_ci_hi: float | None
    tokens_per_s_n: int = Field(description="runs this rate rests on")
    tokens_per_cpu_s: float | None = Field(
        description="steady-state tokens per CPU second of the trainer's process and of the rollout jobs made for it"
    )
    tokens_per_cpu_s_lo: float | None
    tokens_per_cpu_s_hi: float | None
    tokens_per_cpu_s_interval: str | None = Field(description=INTERVAL_HELP)
    tokens_per_cpu_s_ci_lo: float | None
    tokens_per_cpu_s_ci_hi: float | None
    tokens_per_cpu_s_n: int = Field(description="runs this rate rests on")
    cold_start_s: float | None = Field(
        description="start-up and θ0 warm start before the first step, seconds (reported apart: no rate includes it)"
    )
    cold_start_s_lo: float | None
    cold_start_s_hi: float | None
    cold_start_s_interval: str | None = Field(description=INTERVAL_HELP)
    cold_start_s_ci_lo: float | None
    cold_start_s_ci_hi: float | None
    cold_start_s_n: int = Field(description="runs this rate rests on")


class ComparedRunOut(LineOut):
    model_config = ConfigDict(populate_by_name=True)

    id: int
    staleness: str
    seed: int
    status: str
    collapsed: bool | None = Field(description="its policy collapsed; null until it ended")
    collapsed_step: float | None = Field(description="the step it collapsed at")
    final: float | None = Field(
        description="its final value of the metric (`rule`); null if it ended early (it has none)"
    )
    ended_early: bool = Field(
        description="failed, cancelled or lost before its last step: left out of every final value, "
        "statistic, throughput, speed-up and claim"
    )
    progress: int = Field(description="the last step it stored")
    steps: int = Field(description="the steps its config asks for")
    last_kl_init: float | None = Field(alias="kl/init", description="its last logged kl/init")
    last_reward_mean: float | None = Field(alias="reward/mean", description="its last logged reward/mean")
    execution: str = Field(description="simulated, distributed or async")
    duration_s: float | None = Field(description="from start to end (so far, while it runs)")
    measured: bool = Field(description="its worker measured its phases, CPU and machine load")
    contended: bool | None = Field(description="it ran contended; null: not known")
    others_cores: float | None = Field(
        description="cores other processes used on its machine meanwhile, on average"
    )
    steps_per_hour: float | None
    tokens_per_s: float | None
    tokens_per_cpu_s: float | None
    cold_start_s: float | None
    first_step_s: float | None


class RatioOut(Schema):
    value: float | None = Field(description="the geometric mean over seed pairs")
    lo: float | None
    hi: float | None
    interval: str | None = Field(description=INTERVAL_HELP)
    n_pairs: int


class ChangeOut(Schema):
    value: float | None = Field(
        description="the cell's final value minus the reference's, paired by seed, rounded"
    )
    lo: float | None
    hi: float | None
    interval: str | None = Field(description=INTERVAL_HELP)
    n_pairs: int


class SpeedupOut(Schema):
    experiment: int
    preset: str
    line: str = Field(description="the preset · its variant: cells are paired within one line")
    staleness: str = Field(description="the distributed or async cell")
    reference: str = Field(description="the simulated cell it is measured against")
    against: str = Field(description="why that one: the same bound, on-policy, or its own schedule")
    speedup: RatioOut = Field(
        description="the reference's wall-clock per steady step over the cell's (above 1: faster)"
    )
    cpu_cost: RatioOut = Field(description="the cell's CPU seconds per steady step over the reference's")
    accuracy_change: ChangeOut
    wall_per_step_s: float | None = Field(
        description="the cell's wall-clock per steady step, evaluations included"
    )
    reference_wall_per_step_s: float | None
    n_pairs: int = Field(description="seed pairs of measured runs that count")
    others_cores: float | None = Field(
        description="mean cores other processes used while the cell's measured runs ran (None: none measured)"
    )
    reference_others_cores: float | None = Field(description="the same for the reference cell's runs")
    n_left_out: int = Field(
        description="runs of the two cells left out: contended, not measured, still going or ended early"
    )
    n_active: int = Field(description="runs of the two cells still queued or running")
    n_ended_early: int = Field(
        description="runs of the two cells that failed, were cancelled or were lost before their last step"
    )


class BaselineOut(Schema):
    staleness: str = Field(
        description="the cell changes are taken from: on-policy, or on-policy (distributed)"
    )
    experiment: int = Field(
        description="its experiment: the line's own, or the compared one it was borrowed from"
    )


class DropOut(LineOut, IntervalOut):
    staleness: str
    baseline: BaselineOut
    n_seeds: int = Field(description="seed pairs")
    value: float | None = Field(
        description="final value minus the line's on-policy one, paired by seed, rounded to `digits` decimals"
    )
    std: float | None


class RobustnessOut(LineOut):
    baseline: BaselineOut
    settings: list[str]
    mean_drop: float | None
    worst_drop: float | None
    tolerance: str | None = Field(
        description="the stalest setting whose drop's interval stays within δ below 0"
    )
    rank: int | None = Field(
        description="by mean drop within its experiment (equal mean drops share a rank: 1, 1, 3); null if not ranked"
    )
    n_seeds: int = Field(description="the fewest seed pairs its drops rest on")
    interval: str | None = Field(description="the kind of interval of that drop: " + INTERVAL_HELP)


class TieOut(IntervalOut):
    experiment: int
    variant: str = Field(description="the variant both presets share (ties compare presets within one)")
    staleness: str
    a: str
    b: str
    n_seeds: int
    value: float | None = Field(description="b − a, paired by seed")
    std: float | None
    seeds_needed: int | None = Field(description="seeds per preset that would tell them apart")


class EstimateOut(Schema):
    value: float | None
    lo: float | None = Field(description="lower end of the CI")
    hi: float | None
    n: int = Field(description="runs it rests on (per side for P(X > Y): the fewer)")
    method: str = Field(description="stratified percentile bootstrap")
    reps: int
    seed: int = Field(description="the bootstrap's RNG seed")
    confidence: float


class StatisticsCellOut(Schema):
    line: str
    experiment: int
    staleness: str
    n: int
    few_seeds: bool = Field(
        description="fewer than few_seeds runs: its interval is no CI (the page shows none, as for every "
        "interval over fewer than 5 seeds)"
    )
    n_ended_early: int = Field(description="runs of the cell that ended before their last step: left out")
    n_active: int = Field(
        description="runs of the cell still queued or running: their values so far are in it (provisional)"
    )
    iqm: EstimateOut = Field(description="interquartile mean (25% trimmed) over the cell's seeds")
    mean: EstimateOut


class ImprovementOut(Schema):
    experiment: int
    variant: str
    staleness: str
    a: str
    b: str
    paired: bool = Field(
        description="both cells ran the same seeds: seed pairs resampled together; else unpaired"
    )
    poi: EstimateOut = Field(description="P(a > b), ties counted ½")


class ProfileLineOut(Schema):
    line: str
    n: int = Field(
        description="its runs (seeds): below few_seeds, lo and hi are no CI and the page draws no band"
    )
    value: list[float] = Field(description="share of its runs scoring above each τ")
    lo: list[float]
    hi: list[float]


class ProfileOut(Schema):
    staleness: str
    taus: list[float]
    lines: list[ProfileLineOut]
    method: str
    reps: int
    seed: int


class StatisticsOut(Schema):
    cells: list[StatisticsCellOut]
    improvement: list[ImprovementOut]
    profiles: list[ProfileOut]
    few_seeds: int


class EvalNoiseOut(Schema):
    eval_size: int = Field(description="prompts per evaluation (the fewest of the runs')")
    accuracy: float = Field(description="the runs' mean final accuracy")
    evaluations: int = Field(description="evaluations the final value averages (mean of the last k: k)")
    standard_error: float = Field(
        description="√(p(1 − p)/eval_size/evaluations): one run's final value's noise"
    )
    exceeds_delta: bool = Field(description="the standard error is larger than δ: one run cannot resolve δ")


class LagOut(Schema):
    mean_lag: float = Field(
        description="versions behind on-policy its runs trained at, mean over their steps: the schedule's, "
        "or an async cell's as its runs logged it (`staleness`)"
    )
    measured: bool = Field(
        description="mean_lag is measured (async); false: the schedule's, or the bound until measured"
    )
    bound: int | None = Field(description="an async cell's max_staleness")


class BorrowedOut(Schema):
    experiment: int
    preset: str = Field(description="the line (preset · variant) that borrowed")
    from_experiment: int = Field(
        description="the compared experiment whose on-policy runs are this line's baseline"
    )


class FieldOut(Schema):
    name: str = Field(description="preset, staleness, or a varied config field (dotted)")
    label: str = Field(description="its short name")
    values: list[Any] = Field(description="the values the compared runs have, in order")


class ContrastOut(IntervalOut):
    field: str = Field(description="the varied config field")
    label: str
    field_value: Any = Field(description="the value compared")
    reference: Any = Field(description="the field's first value, the change is taken from")
    experiment: int
    preset: str
    others: str = Field(description="the other varied fields' values, held fixed")
    staleness: str
    state: str = Field(
        description="higher, lower (interval excludes 0), within δ, or cannot tell; provisional while runs go"
    )
    n_seeds: int = Field(description="seed pairs")
    value: float | None = Field(
        description="the final value at field_value minus at reference, paired by seed, rounded to `digits` decimals"
    )
    std: float | None


class ExperimentRefOut(Schema):
    id: int
    name: str


class DamagedOut(Schema):
    run: int = Field(description="the run left out")
    metric: str = Field(description="its metric with a damaged chunk")
    note: str = Field(description="what the page says: the run, the metric, the steps and why")


class ComparisonOut(Schema):
    """What the comparison dashboard draws (`dashboards.comparison.compare.compare`)."""

    warnings: list[str] = Field(description="differences in θ0, data or versions between the runs")
    damaged: list[DamagedOut] = Field(
        description="runs left out because points of the metric (or of the response lengths x = tokens counts) "
        "are stored in a damaged chunk, unreadable"
    )
    metric: str
    x: str
    band: str
    rule: str
    k: int
    delta: float
    digits: int = Field(description="decimals changes are shown and compared with δ at")
    min_ci_seeds: int = Field(description="seeds from which an interval is a bootstrap CI (below: min–max)")
    active: bool
    experiments: list[ExperimentRefOut]
    presets: list[str]
    fields: list[FieldOut] = Field(description="what the page can facet, colour and pair by")
    lines: list[LineOut]
    staleness: list[str] = Field(
        description="staleness cell labels, from on-policy to the stalest (by mean lag)"
    )
    lags: dict[str, LagOut] = Field(description="per staleness cell, the lag its runs trained at")
    colours: dict[str, str] = Field(description="each preset's colour")
    palette: list[str] = Field(description="colours for the values of any other field, in its values' order")
    groups: list[GroupOut]
    summary: list[FinalValueOut]
    throughput: list[ThroughputOut]
    contended: bool = Field(
        description="contended runs count in the throughput and the speed-ups (contended=1)"
    )
    speedups: list[SpeedupOut] = Field(
        description="each distributed or async cell against its matching simulated cells: wall-clock, CPU, accuracy"
    )
    runs: list[ComparedRunOut]
    drops: list[DropOut]
    robustness: list[RobustnessOut]
    ties: list[TieOut]
    findings: list[FindingOut]
    eval_noise: EvalNoiseOut | None = Field(
        description="the held-out accuracy's evaluation noise beside δ (eval/accuracy, rules last, best, "
        "mean of the last k; else null)"
    )
    findings_left_out: list[FindingLeftOutOut] = Field(
        description="the paper's claim templates not checked: the sweep never ran their presets"
    )
    borrowed: list[BorrowedOut] = Field(description="lines whose on-policy baseline is another experiment's")
    contrasts: list[ContrastOut] = Field(
        description="each varied field's values against its first, in cells differing in that field only, paired by seed"
    )
    statistics: StatisticsOut = Field(
        description="rliable's few-seed statistics of the final values: IQM, P(X > Y), performance profiles"
    )
    n_ended_early: int = Field(
        description="compared runs that failed, were cancelled or were lost before their last step "
        "(Run.ended_early): drawn in the curves up to where they ended, left out of everything else"
    )
