"""The field's losses under staleness, through the platform: docs/algorithms.md §10's CPU demo
setting (the built-in tiny model, 16 prompts × 8 responses, lr 3e-5, 150 steps) with 4
mini-batches per step, 3 seeds, a grid's presets × {on-policy, sync_offset 8, offline}. Two
training workers (1 torch thread each) run the sweeps; the numbers are read back through the
comparison page's own payload (`dashboards.comparison.compare.compare`): final held-out greedy
accuracy per cell (mean over seeds, 95% bootstrap CI from 5 seeds, their min–max below) and the
paired drop from the same preset's on-policy runs, each also with its 95% t-interval over the seeds
(the page shows min–max below 5 seeds). Writes the grid's section into BENCHMARKS.md and prints
it; `--report-only` reports the experiments an earlier run of the grid left in its folder again.

Two grids, each its own experiment, scratch folder and BENCHMARKS.md section:

- `field` (the default): `grpo` and the losses of docs/algorithms.md §13, plus an on-policy pair
  with bfloat16 rollouts (grpo against grpo-tis);
- `newest`: `grpo` and the losses of §16 (since late 2025); `grpo` is run again so that every
  preset's numbers are paired by seed with it within one experiment.

    .venv/bin/python bench/field_losses.py [--grid field|newest] [--seeds 3] [--steps 150] [--report-only]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lab_workers import (  # noqa: E402
    REPO,
    setup_django,
    setup_existing,
    start_workers,
    stop_workers,
    sweep_on_workers,
)
from report import write_section  # noqa: E402

STALENESS = [{}, {"sync_offset": 8}, {"offline": True}]
LABELS = ["on-policy", "sync_offset=8", "offline"]
PAIR_NAME = "bfloat16 rollouts: plain vs TIS"


@dataclass(frozen=True)
class Grid:
    """One grid: its presets, experiment name, scratch folder (under var/) and BENCHMARKS.md
    section title; `pair`: whether it also runs the bfloat16 pair."""

    presets: list[str]
    name: str
    folder: str
    title: str
    pair: bool

    @property
    def scratch(self) -> Path:
        return REPO / "var" / self.folder


GRIDS = {
    "field": Grid(
        ["grpo", "rec-oneside-nois", "decoupled-ppo", "grpo-tis", "m2po", "cispo", "sapo", "dppo-tv"],
        "the field's losses under staleness",
        "bench-field-losses",
        "## The field's losses under staleness (bench/field_losses.py)",
        pair=True,
    ),
    "newest": Grid(
        ["grpo", "icepop", "kpop", "trm", "dppo-kl", "ce-gppo", "dro", "bapo"],
        "the field's newest losses under staleness",
        "bench-field-losses-newest",
        "## The field's newest losses under staleness (`bench/field_losses.py --grid newest`)",
        pair=False,
    ),
}


# t_{0.975, df}: a paired mean's 95% CI over few seeds (the page shows their min–max below 5 seeds).
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def t_interval(values: list[float]) -> tuple[float, float, float]:
    """(mean, lo, hi): the mean of `values` with its 95% t-interval (n ≥ 2)."""
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = T975.get(n - 1, 1.96) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def finals(experiment) -> dict[tuple[str, str], dict[int, float]]:
    """Each run's final held-out accuracy (its last eval/accuracy), by (preset, staleness) and seed."""
    from experiments import series

    out: dict[tuple[str, str], dict[int, float]] = {}
    for run in experiment.runs.all():
        steps, values, _ = series.series(run.pk, "eval/accuracy")
        out.setdefault((run.preset, run.staleness), {})[run.seed] = float(values[steps.argmax()])
    return out


def paired(a: dict[int, float], b: dict[int, float]) -> str:
    """a − b paired by seed: its mean, the 95% t-interval, and the seeds' min–max (the page's)."""
    d = [a[s] - b[s] for s in sorted(a.keys() & b.keys())]
    mean, lo, hi = t_interval(d)
    return f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}] (min–max {min(d):+.3f}…{max(d):+.3f})"


def report(spec: Grid, grid, pair, minutes: float | None, seeds: int, steps: int) -> str:
    from dashboards.comparison.compare import compare
    from dashboards.comparison.query import ComparisonQuery
    from experiments import series

    # The page's own numbers: every mean and drop below is what the comparison shows.
    payload = compare(grid.runs.all(), ComparisonQuery())
    summary = {(r["preset"], r["staleness"]): r for r in payload["summary"]}
    drops = {(r["preset"], r["staleness"]): r for r in payload["drops"]}
    values = finals(grid)
    took = ""
    if minutes is not None:
        niceness = os.nice(0)
        took = f" in {minutes:.0f} min" + (
            f" (at nice {niceness} beside other work on the machine: an upper bound on the time the grid takes)"
            if niceness > 0
            else ""
        )
    lines = [
        spec.title,
        "",
        f"Experiment #{grid.pk}: {len(spec.presets)} presets × {len(STALENESS)} settings × {seeds} seeds, {steps} steps, "
        f"16 × 8, lr 3e-5, 4 mini-batches per step, run through the platform on two training workers (1 thread "
        f"each){took}. Final held-out greedy accuracy (200 prompts, step {steps}), mean over seeds (on-policy: ± the "
        "95% t-interval of the mean); the stale settings with the drop from on-policy paired by seed, its 95% "
        "t-interval over the seed pairs and their min–max (the comparison page shows the min–max below 5 seeds, "
        "and the same means and drops).",
        "",
        "| preset | on-policy | sync_offset=8: final (drop [95% CI] (min–max)) | offline: final (drop [95% CI] (min–max)) |",
        "|---|---|---|---|",
    ]
    for p in spec.presets:
        on = values[(p, "on-policy")]
        mean, lo, hi = t_interval(list(on.values()))
        assert abs(mean - summary[(p, "on-policy")]["value"]) < 1e-9, "the page's mean"
        cells = [f"{mean:.3f} [{lo:.3f}, {hi:.3f}]"]
        for label in LABELS[1:]:
            assert (
                abs(
                    drops[(p, label)]["value"]
                    - round(sum(values[(p, label)][s] - on[s] for s in on) / len(on), 3)
                )
                < 1e-9
            )
            cells.append(f"{summary[(p, label)]['value']:.3f} ({paired(values[(p, label)], on)})")
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    if pair is None:
        return "\n".join([*lines, ""])
    low = finals(pair)
    k3 = [
        value
        for run in pair.runs.all()
        for value in series.series(run.pk, "mismatch/k3")[1].tolist()
        if math.isfinite(value)
    ]
    same = {name: values[(name, "on-policy")] for name in ("grpo", "grpo-tis")}
    mean_of = lambda d: sum(d.values()) / len(d)  # noqa: E731
    lines += [
        "",
        f"bfloat16 rollouts, on-policy (experiment #{pair.pk}; mean `mismatch/k3` {sum(k3) / len(k3):.1e}): grpo "
        f"{mean_of(low[('grpo', 'on-policy')]):.3f}, grpo-tis {mean_of(low[('grpo-tis', 'on-policy')]):.3f}. "
        f"grpo-tis − grpo paired by seed: {paired(low[('grpo-tis', 'on-policy')], low[('grpo', 'on-policy')])}. "
        f"bfloat16 − the same preset at the trainer's precision (experiment #{grid.pk}), paired by seed: grpo "
        f"{paired(low[('grpo', 'on-policy')], same['grpo'])}, grpo-tis {paired(low[('grpo-tis', 'on-policy')], same['grpo-tis'])}.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", choices=sorted(GRIDS), default="field", help="which presets (see above)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument(
        "--report-only", action="store_true", help="report the experiments a previous run left in its folder"
    )
    args = parser.parse_args()
    spec = GRIDS[args.grid]
    if args.report_only:
        setup_existing(spec.scratch)
        from experiments.models import Experiment

        grid = Experiment.objects.get(name=spec.name)
        pair = Experiment.objects.get(name=PAIR_NAME) if spec.pair else None
        section = report(spec, grid, pair, None, args.seeds, args.steps)
    else:
        env = setup_django(spec.scratch)
        base = {"steps": args.steps, "optimizer": {"minibatches": 4}, "device": "cpu", "samples_per_step": 0}
        seeds = list(range(args.seeds))
        started = time.monotonic()
        workers = start_workers(env, spec.scratch, ("cpu", "cpu"), limit_s=6 * 3600)
        try:
            grid = sweep_on_workers(base, spec.name, STALENESS, seeds, presets=spec.presets)
            pair = None
            if spec.pair:
                low = {**base, "rollout": {"dtype": "bfloat16"}}
                pair = sweep_on_workers(low, PAIR_NAME, [{}], seeds, presets=["grpo", "grpo-tis"])
        finally:
            stop_workers(workers)
        section = report(spec, grid, pair, (time.monotonic() - started) / 60, args.seeds, args.steps)
    write_section(section)
    print(section)


if __name__ == "__main__":
    main()
