"""The field's losses under staleness, through the platform: docs/algorithms.md §10's CPU demo
setting (the built-in tiny model, 16 prompts × 8 responses, lr 3e-5, 150 steps) with 4
mini-batches per step, 3 seeds, `PRESETS` × {on-policy, sync_offset 8, offline}, plus an on-policy
pair with bfloat16 rollouts (grpo against grpo-tis). Two training workers (1 torch thread each) run
the sweeps; the numbers are read back through the comparison page's own payload
(`dashboards.compare.compare`): final held-out greedy accuracy per cell (mean over seeds, 95%
bootstrap CI) and the paired drop from the same preset's on-policy runs. The bfloat16 pair is
compared, paired by seed, with `curves.paired_difference`, the page's statistics. Writes its
section into BENCHMARKS.md and prints it.

    .venv/bin/python bench/field_losses.py [--seeds 3] [--steps 150]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lab_workers import REPO, setup_django, start_workers, stop_workers, sweep_on_workers  # noqa: E402
from report import write_section  # noqa: E402

SCRATCH = REPO / "var" / "bench-field-losses"
PRESETS = ["grpo", "rec-oneside-nois", "decoupled-ppo", "grpo-tis", "m2po", "cispo", "sapo", "dppo-tv"]
STALENESS = [{}, {"sync_offset": 8}, {"offline": True}]
LABELS = ["on-policy", "sync_offset=8", "offline"]


def cell(summary: dict, drops: dict, preset: str, label: str) -> str:
    row = summary[(preset, label)]
    text = f"{row['value']:.3f}"
    if label == "on-policy":
        return text + (f" [{row['ci_lo']:.3f}, {row['ci_hi']:.3f}]" if row["ci_lo"] is not None else "")
    d = drops.get((preset, label))
    if d is None or d["value"] is None:
        return text
    interval = f" [{d['lo']:+.3f}, {d['hi']:+.3f}]" if d["lo"] is not None else ""
    return f"{text} ({d['value']:+.3f}{interval})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args()
    env = setup_django(SCRATCH)
    from dashboards import curves
    from dashboards.compare import compare
    from dashboards.query import ComparisonQuery

    base = {"steps": args.steps, "optimizer": {"minibatches": 4}, "device": "cpu", "samples_per_step": 0}
    seeds = list(range(args.seeds))
    started = time.monotonic()
    procs = start_workers(env, SCRATCH, ("cpu", "cpu"), limit_s=6 * 3600)
    try:
        grid = sweep_on_workers(base, "the field's losses under staleness", STALENESS, seeds, presets=PRESETS)
        low = {**base, "rollout": {"dtype": "bfloat16"}}
        pair = sweep_on_workers(
            low, "bfloat16 rollouts: plain vs TIS", [{}], seeds, presets=["grpo", "grpo-tis"]
        )
    finally:
        stop_workers(procs)
    minutes = (time.monotonic() - started) / 60

    payload = compare(grid.runs.all(), ComparisonQuery())
    summary = {(r["preset"], r["staleness"]): r for r in payload["summary"]}
    drops = {(r["preset"], r["staleness"]): r for r in payload["drops"]}
    lines = [
        "## The field's losses under staleness (bench/field_losses.py)",
        "",
        f"Experiment #{grid.pk}: {len(PRESETS)} presets × {len(STALENESS)} settings × {args.seeds} seeds, "
        f"{args.steps} steps, 16 × 8, lr 3e-5, 4 mini-batches per step, run through the platform on two "
        f"training workers (1 thread each) in {minutes:.0f} min. Final held-out greedy accuracy (200 prompts), "
        "mean over seeds; on-policy with its 95% bootstrap CI over seeds, the stale settings with the "
        "paired drop from on-policy and its 95% CI, as the comparison page shows them.",
        "",
        "| preset | " + " | ".join(LABELS) + " |",
        "|---|" + "---|" * len(LABELS),
    ]
    lines += [f"| {p} | " + " | ".join(cell(summary, drops, p, s) for s in LABELS) + " |" for p in PRESETS]
    finals = {}
    for run in pair.runs.all():
        points = dict(run.points.filter(name="eval/accuracy").values_list("step", "value"))
        finals.setdefault(run.preset, {})[run.seed] = points[max(points)]
        finals[(run.preset, "mismatch")] = finals.get((run.preset, "mismatch"), []) + list(
            run.points.filter(name="mismatch/k3").values_list("value", flat=True)
        )
    d = curves.paired_difference(finals["grpo-tis"], finals["grpo"])
    same = {p: summary[(p, "on-policy")] for p in ("grpo", "grpo-tis")}
    k3 = finals[("grpo", "mismatch")] + finals[("grpo-tis", "mismatch")]
    lines += [
        "",
        f"bfloat16 rollouts, on-policy (experiment #{pair.pk}, mean mismatch/k3 {sum(k3) / len(k3):.2e}): "
        f"grpo {sum(finals['grpo'].values()) / len(finals['grpo']):.3f}, grpo-tis "
        f"{sum(finals['grpo-tis'].values()) / len(finals['grpo-tis']):.3f} "
        f"(same precision: {same['grpo']['value']:.3f}, {same['grpo-tis']['value']:.3f}); "
        f"grpo-tis − grpo paired by seed {d.mean:+.3f} "
        + (
            f"[{d.lo:+.3f}, {d.hi:+.3f}] ({d.interval}, {d.n_pairs} pairs)."
            if d.has_interval
            else "(one pair: no interval)."
        ),
        "",
    ]
    section = "\n".join(lines)
    write_section(section)
    print(section)


if __name__ == "__main__":
    main()
