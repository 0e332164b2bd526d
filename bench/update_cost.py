"""What the other sources of off-policyness cost per trainer step, each against plain `grpo` (one
optimiser step, behaviour anchor) in the same run: a proximal anchor (with one optimiser step p is
π itself: no extra forward), 4 mini-batches per step (4 optimiser steps, and the proximal forward,
one no-grad forward of the batch under the step-start weights, `time/proximal_s`), and both.

The settings are `bench/rl_step.py`'s (the built-in tiny model of `examples/arithmetic.yaml`, 8
prompts × 8 responses, 6 new tokens, fp32, CPU, 2 threads). Each round is a fresh subprocess running
one variant; rounds run interleaved (plain, proximal, 4 mini-batches, plain, …), each waits for an
idle machine after its warm-up steps and measures the CPU other processes used during its timed
steps (contended rounds are reported and left out). A round's number is the median over its timed
steps of `time/update_s` (the trainer's part of the step: forwards, backwards, optimiser steps) and
of `time/step_s`; the section gives the medians over clean rounds and their ratios to plain `grpo`.

    .venv/bin/python bench/update_cost.py [--rounds 3] [--steps 20]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rl_step import (
    EXAMPLE,
    MAX_OTHERS,
    ROOT,
    THREADS,
    bench_config,
    machine,
    train_windowed,
)  # noqa: E402

SECTION = "## The cost of a proximal forward and of mini-batches (`bench/update_cost.py`)"
VARIANTS = {
    "grpo": {},
    "grpo, anchor proximal": {"algorithm": {"preset": "grpo", "params": {"anchor": "proximal"}}},
    "grpo, 4 mini-batches": {"optimizer": {"minibatches": 4}},
    "grpo, anchor proximal, 4 mini-batches": {
        "algorithm": {"preset": "grpo", "params": {"anchor": "proximal"}},
        "optimizer": {"minibatches": 4},
    },
}


def run_variant(name: str, warmup: int, steps: int) -> dict:
    """One round in this process: the variant's per-step update and step seconds, and the contention."""
    from rlcore.config import RunConfig

    data = bench_config(warmup + steps).model_dump()
    data["algorithm"] = {"preset": "grpo"}
    for section, values in VARIANTS[name].items():
        data[section] = {**data[section], **values}
    sink, others = train_windowed(RunConfig.model_validate(data), warmup)
    timed = lambda metric: [v for s, v in sink.series(metric) if s > warmup]  # noqa: E731
    return {
        "update": timed("time/update_s"),
        "proximal": timed("time/proximal_s"),
        "step": timed("time/step_s"),
        "others": others,
    }


def run_round(name: str, warmup: int, steps: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "MKL_NUM_THREADS": str(THREADS)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    with tempfile.NamedTemporaryFile(suffix=".json") as result:
        command = [sys.executable, __file__, "--variant", name, "--result", result.name]
        command += ["--warmup", str(warmup), "--steps", str(steps)]
        done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stdout + done.stderr)
            raise RuntimeError(f"the {name} round failed (exit {done.returncode})")
        return json.loads(Path(result.name).read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="clean rounds per variant (interleaved)")
    parser.add_argument("--max-rounds", type=int, default=8, help="give up after this many per variant")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--variant", choices=list(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        args.result.write_text(json.dumps(run_variant(args.variant, args.warmup, args.steps)))
        return 0

    rounds: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    for i in range(args.max_rounds):
        for name in VARIANTS:
            done = run_round(name, args.warmup, args.steps)
            rounds[name].append(done)
            print(
                f"round {i + 1} {name:>24}: update {1000 * statistics.median(done['update']):6.1f} ms, "
                f"step {1000 * statistics.median(done['step']):6.1f} ms, others {done['others']:.2f}",
                flush=True,
            )
        if all(sum(r["others"] <= MAX_OTHERS for r in rs) >= args.rounds for rs in rounds.values()):
            break

    def median_of(name: str, key: str) -> float:
        clean = [statistics.median(r[key]) for r in rounds[name] if r["others"] <= MAX_OTHERS]
        return 1000 * statistics.median(clean) if clean else math.nan

    enough = all(sum(r["others"] <= MAX_OTHERS for r in rs) >= args.rounds for rs in rounds.values())
    run = bench_config(args.warmup + args.steps)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    base_update, base_step = median_of("grpo", "update"), median_of("grpo", "step")
    lines = [
        SECTION,
        "",
        f"Measured {now} on {machine()}.",
        "",
        f"`{EXAMPLE.relative_to(ROOT)}`'s settings ({run.rollout.prompts_per_step} × {run.rollout.group_size}, "
        f"`max_new_tokens` {run.rollout.max_new_tokens}, fp32, CPU, {THREADS} threads), preset `grpo`; each round a "
        f"fresh subprocess, {args.warmup} warm-up and {args.steps} timed steps, variants interleaved; medians over "
        f"the rounds where other processes used at most {MAX_OTHERS} cores"
        + ("" if enough else f" (fewer than {args.rounds} such rounds for some variant: indicative only)")
        + ".",
        "",
        "| variant | update ms/step | × plain | of which the proximal forward | step ms/step | × plain | clean rounds |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in VARIANTS:
        update, step, proximal = (
            median_of(name, "update"),
            median_of(name, "step"),
            median_of(name, "proximal"),
        )
        clean = sum(r["others"] <= MAX_OTHERS for r in rounds[name])
        lines.append(
            f"| {name} | {update:.1f} | {update / base_update:.2f}× | {proximal:.1f} ms | {step:.1f} | "
            f"{step / base_step:.2f}× | {clean} of {len(rounds[name])} |"
        )
    lines.append("")
    section = "\n".join(lines)
    from report import write_section

    write_section(section)
    print(section)
    return 0 if enough else 2


if __name__ == "__main__":
    sys.exit(main())
