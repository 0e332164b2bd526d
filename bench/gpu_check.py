"""The GPU check: one short distributed run whose rollouts vLLM generates on a `rollout-gpu`
worker, for a machine with an NVIDIA GPU and the `gpu` extra (`make install EXTRAS=gpu`).

What it runs (a few minutes, SQLite and the filesystem broker under var/gpu-check/):
1. a training worker on queue `gpu` and a rollout worker on `rollout-gpu` (`rollout` with
   `--engine hf`) (real Celery processes); a 10-step on-policy `distributed` run of the built-in
   tiny model with `rollout.engine: vllm` (`--engine hf`: the HF engine on the GPU, for a machine
   without vLLM), `device: cuda`.
2. on a machine with two GPUs or more, the same run with `execution.train_processes: 2` (two
   trainer ranks, FSDP2 over NCCL), compared with the one-process run point by point.
3. the engine alone in this process on the same model, generating the run's step-1 prompts as
   the rollout worker does (the reference for tokens/s).

What it prints: whether the run succeeded; behaviour vs trainer log-prob agreement on-policy
(max |kl/behavior| and max is_ratio/max over the steps: vLLM's log-probs against the
trainer's); weight publish time and bytes per version and the rollout worker's weight load
time (from its log); tokens/s of the engine inside rollout jobs against the engine alone.

    .venv/bin/python bench/gpu_check.py [--engine hf]
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "platform")]

from bench.lab_workers import (  # noqa: E402
    CACHE,
    run_on_workers,
    series,
    setup_django,
    start_workers,
    stop_workers,
)

SCRATCH = REPO / "var" / "gpu-check"
STEPS = 10
CONFIG = {
    "rollout": {"engine": "vllm", "prompts_per_step": 16, "group_size": 8, "max_new_tokens": 6},
    "execution": {"mode": "distributed"},
    "device": "cuda",
    "steps": STEPS,
    "eval_every": 5,
    "checkpoint_every": 0,
}


def engine_alone(config, prompts: list[list[int]]) -> float:
    """Tokens/s of the run's rollout engine generating `prompts` (one group each) in this process, after a warm-up."""
    from rlcore import models, tasks
    from rlcore.batch import group_rngs
    from rlcore.produce import make_engine

    task = tasks.build(config.task)
    lm = models.load(config, models.resolve_device(config.device), CACHE, task)
    engine = make_engine(config, lm, CACHE, task)
    cfg = config.rollout
    rngs = group_rngs(config.seed, 1, "sampling", range(len(prompts)))
    engine.generate(prompts, cfg.max_new_tokens, cfg.temperature, cfg.top_p, rngs, cfg.group_size)
    started = time.perf_counter()
    rollout = engine.generate(prompts, cfg.max_new_tokens, cfg.temperature, cfg.top_p, rngs, cfg.group_size)
    return float(rollout.response_mask.sum()) / (time.perf_counter() - started)


def largest_difference(run, twin) -> tuple[float, int]:
    """The largest |a - b| / max(1, |a|) between what `run` and `twin` logged (every metric but
    the wall-clock times and rates, at every step both logged), and how many points were compared."""
    from experiments.series import points_of

    def points(of) -> dict[tuple[str, int], float]:
        return {
            (name, step): value
            for name, (steps, values, _) in points_of(of.pk)
            if not name.startswith("time/") and name != "tokens_per_s"
            for step, value in zip(steps.tolist(), values.tolist(), strict=True)
        }

    mine, theirs = points(run), points(twin)
    both = [key for key in mine if key in theirs and math.isfinite(mine[key]) and math.isfinite(theirs[key])]
    worst = max((abs(mine[k] - theirs[k]) / max(1.0, abs(mine[k])) for k in both), default=math.nan)
    return worst, len(both)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("vllm", "hf"), default="vllm", help="the rollout engine")
    engine = parser.parse_args().engine
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: this check needs an NVIDIA GPU and `make install EXTRAS=gpu`")
        return 2
    if engine == "vllm" and importlib.util.find_spec("vllm") is None:
        print("vLLM is not installed: `make install EXTRAS=gpu` (or --engine hf to check the rest)")
        return 2
    config = {**CONFIG, "rollout": {**CONFIG["rollout"], "engine": engine}}
    env = setup_django(SCRATCH)
    print(f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}", flush=True)
    from rlcore.config import RunConfig

    checked = RunConfig.model_validate(config)
    # The training worker's queue (`gpu`) and the rollout jobs' (`rollout-gpu` for vLLM; the HF
    # engine's jobs go to `rollout`, whose worker generates on this machine's GPU too).
    workers = start_workers(env, SCRATCH, (checked.queue, checked.rollout_queue))
    gpus = torch.cuda.device_count()
    sharded = None
    try:
        started = time.perf_counter()
        run = run_on_workers(config, f"gpu check ({engine})")
        wall = time.perf_counter() - started
        if gpus >= 2:
            two = {**config, "execution": {**config["execution"], "train_processes": 2}}
            started = time.perf_counter()
            sharded = run_on_workers(two, f"gpu check ({engine}, 2 trainer ranks)")
            sharded_wall = time.perf_counter() - started
    finally:
        stop_workers(workers)
    from experiments.models import PolicyVersion
    from rlcore import models, tasks
    from rlcore.batch import seeded_rng

    config = run.run_config()
    kl = series(run, "kl/behavior")
    ratio = series(run, "is_ratio/max")
    print(
        f"run {run.pk} (rollout engine {engine}): {run.status}, {STEPS} steps in {wall:.1f} s (including loading)"
    )
    print(f"on-policy agreement: max |kl/behavior| {max(abs(v) for v in kl.values()):.2e},")
    print(
        f"  max is_ratio/max {max(ratio.values()):.4f} (1 = the engine's and the trainer's log-probs agree)"
    )
    versions = max(1, PolicyVersion.objects.filter(run=run).count())
    print(
        f"weights: {run.measured.weights_publish_bytes / versions / 1e6:.2f} MB per version, "
        f"publish {1000 * run.measured.weights_publish_s_mean:.1f} ms"
    )
    if sharded is None:
        print(f"{gpus} GPU: the 2-GPU FSDP run (execution.train_processes: 2, NCCL) needs two")
    else:
        worst, points = largest_difference(run, sharded)
        print(
            f"2 trainer ranks (FSDP2, NCCL): run {sharded.pk} {sharded.status}, {sharded_wall:.1f} s; "
            f"against one process, largest |difference| / max(1, |value|) {worst:.1e} over {points} points"
        )
    log = workers[1].log()  # the rollout worker's
    loads = [float(s) for s in re.findall(r"loaded policy version \d+ in ([0-9.]+) s", log)]
    if loads:
        print(
            f"rollout worker weight load: mean {1000 * sum(loads) / len(loads):.1f} ms over {len(loads)} loads"
        )
    tokens = sum(series(run, "response_length/mean").values()) * config.batch_size
    generate_s = sum(series(run, "time/rollout_s").values())
    task = tasks.build(config.task)
    problems = task.sample(config.rollout.prompts_per_step, seeded_rng(config.seed, 1, "prompts"))
    tokenizer = models.load(config, torch.device("cpu"), CACHE, task)
    alone = engine_alone(config, tokenizer.encode([p.prompt for p in problems]))
    print(
        f"{engine} tokens/s: in rollout jobs (generation and scoring) {tokens / generate_s:,.0f}, "
        f"{engine} alone {alone:,.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
