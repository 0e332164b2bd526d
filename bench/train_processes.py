"""A run's trainer in two processes (`execution.train_processes: 2`) against one process, on the same work.

Both sides run `examples/arithmetic.yaml` in simulated mode (8 responses per prompt,
`max_new_tokens` 6, fp32, CPU) with no checkpoints and the smallest evaluation, in three cases
(`CASES`): `tiny`, the built-in model and batch as the example has them (8 prompts a step, STEPS
steps); `wide`, the largest the built-in model allows, with the example's 8 prompts; and `wide-16`,
the same model at the product's default batch of 16 prompts a step (`rollout.prompts_per_step`'s
default, the shape of the lab's own experiments), WIDE_STEPS steps each. They run through the
command line as a user would: (a) `python -m rlcore run` in
one process with 2 torch threads, (b) the same with `execution.train_processes: 2`, where
`python -m rlcore run` starts torchrun with 2 ranks of 1 thread each (gloo). The runs alternate
(a), (b), (a), (b), … for `--rounds` rounds, each a fresh process, on 2 cores (pinned as the
other benchmarks are). A run's tokens/s is steady state: the response tokens of the steps after
the first divided by those steps' `time/step_s` (rank 0's, which waits for the other rank in the
collectives), the tokens from each step's `tokens_per_s` × `time/step_s`. The ratio (b)/(a) is
taken per round; its median, min and max are reported, with where the step's time goes
(`time/wait_s`: the publish and taking the batch, of which `time/rollout_s` generating it;
`time/update_s`; medians over the timed steps) and what (b) spends over (a) in each part.

Memory: the same config is run under torchrun with 1 rank and with 2 ranks through this script's
rank target (`--held`), which measures, after the last step, each rank's bytes of parameters +
optimiser state (`rlcore.distributed.held_bytes`, shards only) and of gradients still held.

The section goes into `BENCHMARKS.md`; the exit code is 0 when the 2-rank run reaches
`--target` × one process's tokens/s (the median ratio) in the `wide-16` case (TARGET_CASE), 1
otherwise. The collectives cost about the same every step whatever the batch (the weights'
all-gather and the gradients' reduce-scatter move the whole model), so the fewer tokens a step
trains, the larger their share: the other two cases show it (at the tiny size a step is ≈70 ms),
and their ratios are reported beside the decisive one.

    .venv/bin/python bench/train_processes.py
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "arithmetic.yaml"
SECTION = "## Trainer in 2 processes vs 1 (`bench/train_processes.py`)"
STEPS = 10
WIDE_STEPS = 6
TARGET_CASE = "wide-16"
EVAL_SIZE = 8
RANK_ENV = {"LAB_RANK_TIMEOUT_S": "120"}
# Other processes' CPU use (in cores) above which a run is contended and its round left out: a
# competing process slows one process of 2 threads far more than 2 ranks of 1 (seen: 9× against
# 2.5×), so a contended round says nothing about the ratio.
MAX_OTHERS = 0.1
IDLE_WAIT_S = 120
# The widest the built-in model allows (no warm start: the throughput of a step does not depend on
# what the model answers, every response runs to max_new_tokens either way at this size).
WIDE = {
    "hidden_size": 512,
    "num_layers": 8,
    "num_heads": 8,
    "intermediate_size": 2048,
    "warmstart_max_steps": 0,
}
# name: (the built-in model's settings over the example's, the rollout's over the example's).
CASES = {
    "tiny": ({}, {}),
    "wide": (WIDE, {}),
    "wide-16": (WIDE, {"prompts_per_step": 16}),
}


def two_cores() -> None:
    """Measure as on the 2-core machines the numbers are stated for (children inherit it)."""
    if len(os.sched_getaffinity(0)) > 2:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])


def write_config(directory: Path, processes: int, steps: int, case: str = "tiny") -> Path:
    import yaml

    from rlcore import config

    data = config.load(EXAMPLE).model_dump(mode="json")
    model, rollout = CASES[case]
    data["model"]["tiny"].update(model)
    data["rollout"].update(rollout)
    data.update(
        steps=steps, eval_every=0, eval_size=EVAL_SIZE, checkpoint_every=0, samples_per_step=0, device="cpu"
    )
    data.setdefault("execution", {})
    data["execution"] = {**(data["execution"] or {}), "train_processes": processes}
    config.RunConfig.model_validate(data)  # refuse here, not in the child, a config the run would refuse
    path = directory / f"run-{case}-{processes}-{steps}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def children_cpu_s() -> float:
    """CPU seconds of this process's finished children (and theirs: the CLI waits for torchrun,
    torchrun for its ranks)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def others_cores(wall: float, busy: float, own: float) -> float:
    """CPU cores other processes used over `wall` seconds in which the machine was busy `busy`
    CPU seconds, `own` of them this benchmark's."""
    return max(0.0, busy - own) / wall


def wait_until_idle() -> None:
    """Wait (up to IDLE_WAIT_S) until other processes use at most MAX_OTHERS cores."""
    from workers.measure import machine_busy_s

    deadline = time.monotonic() + IDLE_WAIT_S
    while time.monotonic() < deadline:
        wall, busy, own = time.perf_counter(), machine_busy_s(), time.process_time()
        time.sleep(1.0)
        if (
            others_cores(time.perf_counter() - wall, machine_busy_s() - busy, time.process_time() - own)
            <= MAX_OTHERS
        ):
            return


def run_cli(config: Path, out: Path, cache_dir: Path, threads: int) -> tuple[list[dict], float, float]:
    """`python -m rlcore run config`: its step metrics, the process's wall seconds and the CPU
    cores other processes used meanwhile."""
    from workers.measure import machine_busy_s

    env = {**os.environ, **RANK_ENV, "OMP_NUM_THREADS": str(threads), "LAB_RANK_THREADS": str(threads)}
    command = [
        sys.executable,
        "-m",
        "rlcore",
        "run",
        str(config),
        "--out",
        str(out),
        "--cache-dir",
        str(cache_dir),
    ]
    wait_until_idle()
    busy, own, started = machine_busy_s(), time.process_time() + children_cpu_s(), time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - started
    others = others_cores(wall, machine_busy_s() - busy, time.process_time() + children_cpu_s() - own)
    if proc.returncode != 0:
        raise SystemExit(
            f"{' '.join(command)} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-6000:]}"
        )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    points = [row["metrics"] for row in rows if "metrics" in row and "time/step_s" in row["metrics"]]
    return points, wall, others


def steady(points: list[dict]) -> dict[str, float]:
    """Tokens/s over the steps after the first, and the median seconds of its parts."""
    timed = points[1:]
    if len(timed) < 2:
        raise SystemExit(f"only {len(points)} steps logged; need at least 3")
    seconds = sum(m["time/step_s"] for m in timed)
    tokens = sum(m["tokens_per_s"] * m["time/step_s"] for m in timed)
    parts = {
        name: statistics.median(m[name] for m in timed)
        for name in ("time/step_s", "time/rollout_s", "time/update_s", "time/wait_s")
    }
    return {"tokens_per_s": tokens / seconds, **parts}


def held(config: Path, processes: int, cache_dir: Path, directory: Path) -> list[dict]:
    """Each rank's bytes after the run, from this script's rank target under torchrun."""
    from rlcore import launch

    out = directory / f"held-{processes}.json"
    command = launch.rank_command(
        [Path(__file__).resolve(), "--held", config, out, "--cache-dir", cache_dir], processes
    )
    env = {**os.environ, **RANK_ENV, "OMP_NUM_THREADS": "1", "LAB_RANK_THREADS": "1"}
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"rank target failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-6000:]}")
    return json.loads(out.read_text())


def rank_target(config_path: Path, out: Path, cache_dir: Path) -> None:
    """One rank (under torchrun): train, then gather every rank's bytes; rank 0 writes them to `out`."""
    import torch
    import torch.distributed as dist

    from rlcore import config as run_config
    from rlcore import distributed

    every: list = []

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    def measure(learner, ranks) -> None:
        grads = sum(
            local(p.grad).numel() * p.grad.element_size()
            for p in learner.policy.parameters()
            if p.grad is not None
        )
        mine = {"params_optimizer": distributed.held_bytes(learner), "grads": grads}
        gathered = [None] * ranks.world
        dist.all_gather_object(gathered, mine)
        every.extend(gathered)

    distributed.train(run_config.load(config_path), None, cache_dir=cache_dir, on_done=measure)
    if os.environ["RANK"] == "0":
        out.write_text(json.dumps(every))
    distributed.end_process(0)


def mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=STEPS, help="steps of the tiny case's runs")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument(
        "--target", type=float, default=0.8, help="2 ranks' tokens/s ≥ target × one process's"
    )
    parser.add_argument(
        "--no-write", action="store_true", help="print the section, leave BENCHMARKS.md alone"
    )
    parser.add_argument("--held", nargs=2, type=Path, metavar=("CONFIG", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.held:
        rank_target(*args.held, args.cache_dir)
        return 0
    sys.path.insert(0, str(ROOT / "bench"))
    from report import machine, publish

    two_cores()
    directory = Path(tempfile.mkdtemp(prefix="bench-train-processes-"))
    cache_dir = directory / "cache"
    parts = []
    verdicts = {}
    for case in args.cases:
        part, ratio = measure_case(case, args, directory, cache_dir)
        parts.extend(part)
        verdicts[case] = ratio
    decisive = verdicts.get(TARGET_CASE, max(verdicts.values()))
    ok = decisive >= args.target
    verdict = "PASS" if ok else ("INCONCLUSIVE (no uncontended round)" if math.isnan(decisive) else "FAIL")
    small = {n: write_config(directory, n, 2) for n in (1, 2)}
    one, two = held(small[1], 1, cache_dir, directory), held(small[2], 2, cache_dir, directory)
    mem = ["| | params + optimiser state | gradients |", "|---|---|---|"]
    mem.append(f"| 1 process | {mib(one[0]['params_optimizer'])} | {mib(one[0]['grads'])} |")
    for rank, r in enumerate(two):
        mem.append(
            f"| 2 ranks: rank {rank} | {mib(r['params_optimizer'])} "
            f"({r['params_optimizer'] / one[0]['params_optimizer']:.2f}×) | {mib(r['grads'])} |"
        )
    summary = ", ".join(f"{case} {ratio:.2f}×" for case, ratio in verdicts.items())
    section = "\n".join(
        [
            SECTION,
            "",
            f"{datetime_now()}; {machine(('torch',))}; pinned to 2 cores.",
            "",
            f"`examples/arithmetic.yaml` (8 responses of 6 tokens per prompt, simulated, fp32) through "
            f"`python -m rlcore run`, in three cases: `tiny`, the built-in model and batch as the example "
            f"has them (hidden 128, 4 layers, ≈0.8 M parameters, 8 prompts a step: a step of ≈70 ms, where "
            f"every collective's fixed cost shows); `wide`, the largest the built-in model allows (hidden "
            f"512, 8 layers, MLP 2048, ≈25 M parameters, no warm start) with the example's 8 prompts; "
            f"`wide-16`, the same model at the product's default batch, 16 prompts a step (the shape of "
            f"the lab's own experiments). The collectives move the whole model every step whatever the "
            f"batch, so the fewer tokens a step trains, the larger their share. (a) one process with 2 "
            f"threads, (b) "
            f"`execution.train_processes: 2`, 2 ranks × 1 thread (gloo); {args.rounds} rounds alternating "
            f"(a), (b), each a fresh process. Tokens/s: response tokens of the steps after the first ÷ "
            f"their `time/step_s` (rank 0's); times are medians over rounds of each run's median step. "
            f"Under the simulated schedule each rank generates its share of the prompt groups "
            f"(`time/rollout_s` is the slower rank's).",
            "",
            *parts,
            f"Target: (b) ≥ {args.target} × (a)'s tokens/s in the `{TARGET_CASE}` case, a model and a "
            f"batch where the trainer's work, what sharding is for, outweighs the collectives' fixed cost: "
            f"**{verdict}** ({summary}).",
            "",
            "Bytes each rank holds after the last step (`rlcore.distributed.held_bytes`: its shards of the "
            "parameters and the AdamW state; gradients those still allocated), `tiny` size, measured under "
            "torchrun with 1 rank and with 2:",
            "",
            *mem,
            "",
        ]
    )
    return publish(section, ok, write=not args.no_write)


def measure_case(
    case: str, args: argparse.Namespace, directory: Path, cache_dir: Path
) -> tuple[list[str], float]:
    """(a) and (b) alternating in one case: the section's table and the median ratio."""
    steps = args.steps if case == "tiny" else WIDE_STEPS
    configs = {n: write_config(directory, n, steps, case) for n in (1, 2)}
    results: dict[int, list[dict]] = {1: [], 2: []}
    for round_ in range(args.rounds):
        for processes, threads in ((1, 2), (2, 1)):
            points, wall, others = run_cli(
                configs[processes], directory / f"{case}-r{round_}-{processes}.jsonl", cache_dir, threads
            )
            results[processes].append({**steady(points), "wall_s": wall, "others": others})
            print(
                f"{case}, round {round_ + 1}, {processes} process(es): {results[processes][-1]}", flush=True
            )
    pairs = list(zip(results[1], results[2], strict=True))
    clean = [max(a["others"], b["others"]) <= MAX_OTHERS for a, b in pairs]
    ratios = [b["tokens_per_s"] / a["tokens_per_s"] for a, b in pairs]
    kept = [r for r, ok in zip(ratios, clean, strict=True) if ok]
    ratio = statistics.median(kept) if kept else float("nan")

    def med(processes: int, name: str) -> float:
        values = [r[name] for r, ok in zip(results[processes], clean, strict=True) if ok]
        return statistics.median(values) if values else float("nan")

    def extra(name: str) -> float:  # (b)'s milliseconds over (a)'s
        return 1000 * (med(2, name) - med(1, name))

    rows = [
        f"**`{case}`**, {steps} steps:",
        "",
        "| run | tokens/s (steady) | step ms | publish + batch ms | of which generation ms | update ms "
        "| process wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for processes, label in ((1, "(a) 1 process, 2 threads"), (2, "(b) 2 ranks × 1 thread")):
        rows.append(
            f"| {label} | {med(processes, 'tokens_per_s'):.0f} | {1000 * med(processes, 'time/step_s'):.1f} "
            f"| {1000 * med(processes, 'time/wait_s'):.1f} | {1000 * med(processes, 'time/rollout_s'):.1f} "
            f"| {1000 * med(processes, 'time/update_s'):.1f} | {med(processes, 'wall_s'):.1f} |"
        )
    rows += [
        "",
        "Ratio (b)/(a) per round (others: CPU cores other processes used during (a), (b); ✗ above "
        f"{MAX_OTHERS}: contended, left out of every median): "
        + ", ".join(
            f"{x:.2f} ({a['others']:.2f}, {b['others']:.2f}{'' if ok else ' ✗'})"
            for x, (a, b), ok in zip(ratios, pairs, clean, strict=True)
        )
        + (
            f" (median of {len(kept)} uncontended: {ratio:.2f}, min {min(kept):.2f}, max {max(kept):.2f})."
            if kept
            else " (no uncontended round: no ratio)."
        )
        + f" (b)'s step takes {extra('time/step_s'):+.1f} ms "
        f"over (a)'s: generation {extra('time/rollout_s'):+.1f} ms (each rank its half of the groups on 1 "
        f"thread), the publish and the batch's exchange besides generation "
        f"{extra('time/wait_s') - extra('time/rollout_s'):+.1f} ms (the weights' all-gather, one per FSDP "
        "unit, into the whole copy that generates — the step's forwards and backward then use those "
        f"gathered weights too — and the halves of the batch swapped), the update {extra('time/update_s'):+.1f} "
        "ms (each rank's half of the batch on 1 thread, FSDP's hooks, the gradients' reduce-scatter, one "
        "per unit, the log-probs assembled, the gradient norm and the sums added across ranks: each "
        "collective a point where the faster rank waits for the other).",
        "",
    ]
    return rows, ratio


def datetime_now() -> str:
    import datetime

    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


if __name__ == "__main__":
    sys.exit(main())
