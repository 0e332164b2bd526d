"""End-to-end RL step throughput: rlcore's trainer against TRL's `GRPOTrainer`, on identical work.

Both sides train the built-in tiny model of `examples/arithmetic.yaml` (the same warm-started
directory, so the same θ0) on the same prompts at the same step (8 prompts × 8 responses,
`max_new_tokens` 6, temperature 1.0, top-p 1.0, fp32, CPU, 2 threads), with one AdamW step per
trainer step (same lr, betas, weight decay, grad clip 1.0) and a KL to the initial model
(rlcore: the exact `kl/init` against the frozen θ0; TRL: `beta` > 0, which runs its reference
model). Each round is a fresh subprocess (no shared imports, allocator or threads), rounds run
interleaved (rlcore, TRL, rlcore, TRL, …), and the first steps of each round are warm-up and
not timed. Throughput counts response tokens up to and including EOS, per step, divided by the
step's wall time: rlcore's own `time/step_s` (rollout, reward, loss, backward, clip, optimiser
step) and, for TRL, a `TrainerCallback` from `on_step_begin` to `on_step_end` (generation,
reward, reference forward, loss, backward, clip, optimiser step), with the tokens counted from
the `completion_ids` its reward function receives (TRL cuts them after the first EOS). A
round's tokens/s is the median over its timed steps of tokens / seconds (robust to a stray
slow step). The machines are shared and
2 threads on 2 cores do not survive a competing process (both sides slow down, by different
factors), so each round waits for an idle machine after its warm-up and measures the CPU other
processes used during its timed steps; contended rounds are reported but left out, and pairs
of rounds run until each side has `--rounds` clean ones. The medians and their ratio go into this benchmark's section of
`BENCHMARKS.md`; the exit code is 0 on PASS (rlcore ≥ `--target` × TRL), 1 on FAIL and 2 when
too few rounds were uncontended to decide.

    .venv/bin/python bench/rl_step.py            # or: make bench
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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from report import machine as machine_with  # bench/report.py, beside this script

if TYPE_CHECKING:
    from rlcore.config import RunConfig

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "arithmetic.yaml"
SECTION = "## RL step: rlcore vs TRL `GRPOTrainer` (`bench/rl_step.py`)"
SIDES = ("rlcore", "trl")
THREADS = 2
TRL_BETA = 0.04
EVAL_SIZE = 8  # rlcore evaluates before the first and after the last step, outside the timed steps
# Other processes' CPU use (in cores) above which a round is contended and left out: on 2 cores with
# 2 threads a competing process slows both sides 2-25×, by different factors (seen: the ratio 1.0
# uncontended read 1.4-2.1 under contention).
MAX_OTHERS = 0.1
IDLE_WAIT_S = 120


@dataclass
class Round:
    """One side's timed steps in one subprocess."""

    side: str
    tokens: list[int]
    seconds: list[float]
    others: float  # CPU cores used by other processes during the timed steps

    @property
    def clean(self) -> bool:
        return self.others <= MAX_OTHERS

    @property
    def tokens_per_s(self) -> float:
        """Median over the timed steps of the step's tokens / the step's seconds."""
        return statistics.median(t / s for t, s in zip(self.tokens, self.seconds, strict=True))

    @property
    def ms_per_step(self) -> float:
        return 1000 * statistics.median(self.seconds)

    @property
    def tokens_per_step(self) -> float:
        return sum(self.tokens) / len(self.tokens)


Snapshot = tuple[float, float, float]


def snapshot() -> Snapshot:
    """(wall seconds, CPU seconds busy on the whole machine, CPU seconds of this process)."""
    from workers.measure import machine_busy_s  # the one reading of /proc/stat, as workers measure runs

    return time.perf_counter(), machine_busy_s(), time.process_time()


def others_cores(start: Snapshot, end: Snapshot) -> float:
    """CPU cores used by processes other than this one between two snapshots."""
    wall, busy, own = (b - a for a, b in zip(start, end, strict=True))
    return max(0.0, busy - own) / wall


def wait_until_idle() -> Snapshot:
    """Wait (up to IDLE_WAIT_S) until other processes use at most MAX_OTHERS cores; a snapshot then."""
    deadline = time.monotonic() + IDLE_WAIT_S
    while True:
        start = snapshot()
        time.sleep(1.0)
        end = snapshot()
        if others_cores(start, end) <= MAX_OTHERS or time.monotonic() > deadline:
            return end


def bench_config(steps: int) -> RunConfig:
    """The example's settings, run for `steps` steps on the CPU, with as little eval as allowed."""
    from rlcore import config

    data = config.load(EXAMPLE).model_dump()
    data.update(
        steps=steps, eval_every=0, eval_size=EVAL_SIZE, checkpoint_every=0, samples_per_step=0, device="cpu"
    )
    return config.RunConfig.model_validate(data)


def train_windowed(run: RunConfig, warmup: int, cache_dir: Path | None = None) -> tuple[Any, float]:
    """rlcore's `train` of `run` on THREADS threads, waiting for an idle machine after `warmup`
    steps: (its `ListSink`, the cores other processes used during the steps after the warm-up)."""
    import torch

    torch.set_num_threads(THREADS)
    from rlcore.sinks import ListSink
    from rlcore.trainer import train

    window: list[Snapshot] = []

    class WindowSink(ListSink):
        """Waits for an idle machine after the warm-up steps; snapshots it after each timed step."""

        def log(self, step: int, metrics: dict[str, float]) -> None:
            super().log(step, metrics)
            if step == warmup:
                window[:] = [wait_until_idle()]
            elif step > warmup:
                window[1:] = [snapshot()]

    sink = WindowSink()
    train(run, sink, cache_dir=cache_dir)
    return sink, others_cores(*window)


def run_rlcore(warmup: int, steps: int, cache_dir: Path | None) -> tuple[list[int], list[float], float]:
    """rlcore's `train`: tokens and seconds per step from what it logs, and the contention."""
    run = bench_config(warmup + steps)
    sink, others = train_windowed(run, warmup, cache_dir)
    lengths = [value for _, value in sink.series("response_length/mean")]
    seconds = [value for _, value in sink.series("time/step_s")]
    return [round(length * run.batch_size) for length in lengths], seconds, others


def run_trl(warmup: int, steps: int, cache_dir: Path | None) -> tuple[list[int], list[float], float]:
    """TRL's `GRPOTrainer` on the same model directory, prompts, sampling and optimiser."""
    import torch

    torch.set_num_threads(THREADS)
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlcore import models, tasks
    from rlcore.batch import seeded_rng

    total = warmup + steps
    run = bench_config(total)
    task = tasks.build(run.task)
    path = str(models.tiny_model_path(run, task, cache_dir))
    rollout, opt = run.rollout, run.optimizer
    # rlcore's prompts of steps 1..steps, in order; TRL reads them unshuffled, each repeated K times.
    problems = [
        p
        for step in range(1, total + 1)
        for p in task.sample(rollout.prompts_per_step, seeded_rng(run.seed, step, "prompts"))
    ]
    dataset = Dataset.from_list(
        [{"prompt": p.prompt, "answer": p.answer, "solution": p.solution} for p in problems]
    )
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    eos_id = tokenizer.eos_token_id
    tokens: list[int] = []

    def arithmetic(
        prompts: list[str],
        completions: list[str],
        completion_ids: list[list[int]],
        answer: list[str],
        solution: list[str],
        **_: Any,
    ) -> list[float]:
        tokens.append(sum(len(ids) for ids in completion_ids))
        return [
            task.score(tasks.Problem(p, a, s), c, bool(ids) and ids[-1] == eos_id).reward
            for p, c, ids, a, s in zip(prompts, completions, completion_ids, answer, solution, strict=True)
        ]

    class StepTimer(TrainerCallback):
        """Wall time of each step; waits for an idle machine after the warm-up steps, snapshots it."""

        def __init__(self) -> None:
            self.seconds: list[float] = []
            self.started = 0.0
            self.window: list[Snapshot] = []

        def on_step_begin(self, args: Any, state: Any, *_: Any, **__: Any) -> None:
            if state.global_step == warmup:
                self.window = [wait_until_idle()]
            self.started = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, *_: Any, **__: Any) -> None:
            self.seconds.append(time.perf_counter() - self.started)
            if state.global_step > warmup:
                self.window[1:] = [snapshot()]

    timer = StepTimer()
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out,
            use_cpu=True,
            bf16=False,
            fp16=False,
            model_init_kwargs={"dtype": "float32"},
            per_device_train_batch_size=run.batch_size,
            gradient_accumulation_steps=1,
            steps_per_generation=1,
            num_iterations=1,
            num_generations=rollout.group_size,
            max_completion_length=rollout.max_new_tokens,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            top_k=0,
            beta=TRL_BETA,
            learning_rate=opt.lr,
            lr_scheduler_type="constant",
            optim="adamw_torch",
            adam_beta1=opt.beta1,
            adam_beta2=opt.beta2,
            weight_decay=opt.weight_decay,
            max_grad_norm=opt.grad_clip,
            max_steps=total,
            gradient_checkpointing=False,
            disable_dropout=True,
            shuffle_dataset=False,
            seed=run.seed,
            report_to="none",
            logging_strategy="no",
            save_strategy="no",
            disable_tqdm=True,
        )
        trainer = GRPOTrainer(
            model=path,
            reward_funcs=arithmetic,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[timer],
        )
        trainer.train()
    if len(tokens) != total or len(timer.seconds) != total:
        raise RuntimeError(
            f"TRL ran {len(timer.seconds)} steps with {len(tokens)} generations; expected {total}"
        )
    return tokens, timer.seconds, others_cores(*timer.window)


def run_round(side: str, warmup: int, steps: int, cache_dir: Path | None) -> Round:
    """One round of `side` in a fresh subprocess; the first `warmup` steps are dropped."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(THREADS),
        "MKL_NUM_THREADS": str(THREADS),
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    with tempfile.NamedTemporaryFile(suffix=".json") as result:
        command = [sys.executable, __file__, "--worker", side, "--result", result.name]
        command += ["--warmup", str(warmup), "--steps", str(steps)]
        if cache_dir:
            command += ["--cache-dir", str(cache_dir)]
        done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stdout + done.stderr)
            raise RuntimeError(f"the {side} round failed (exit {done.returncode})")
        data = json.loads(Path(result.name).read_text())
    return Round(side, data["tokens"][warmup:], data["seconds"][warmup:], data["others"])


def machine() -> str:
    return machine_with(("torch", "transformers", "trl"))


def verdict(rounds: list[Round], wanted: int, target: float) -> tuple[dict[str, float], float, str]:
    """Medians of the uncontended rounds per side, their ratio, and PASS / FAIL / INCONCLUSIVE."""
    clean = {side: [r.tokens_per_s for r in rounds if r.side == side and r.clean] for side in SIDES}
    medians = {side: statistics.median(values) if values else math.nan for side, values in clean.items()}
    ratio = medians["rlcore"] / medians["trl"]
    if min(len(values) for values in clean.values()) < wanted:
        return medians, ratio, "INCONCLUSIVE"
    return medians, ratio, "PASS" if ratio >= target else "FAIL"


def report(rounds: list[Round], args: argparse.Namespace) -> tuple[str, str]:
    """The markdown section and the verdict."""
    medians, ratio, outcome = verdict(rounds, args.rounds, args.target)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    run = bench_config(args.warmup + args.steps)
    ro, opt = run.rollout, run.optimizer
    lines = [
        SECTION,
        "",
        f"Measured {now} on {machine()}.",
        "",
        f"Settings (`{EXAMPLE.relative_to(ROOT)}`): built-in tiny Llama, the same warm-started directory for both;",
        f"{ro.prompts_per_step} prompts × {ro.group_size} responses per step, the same prompts at the same step;",
        f"`max_new_tokens` {ro.max_new_tokens}, temperature {ro.temperature}, top-p {ro.top_p}, "
        f"{run.model.dtype}, CPU, {THREADS} threads;",
        f"AdamW lr {opt.lr:g} (β {opt.beta1}/{opt.beta2}, wd {opt.weight_decay}), grad clip {opt.grad_clip}, "
        "one optimiser step per trainer step.",
        f"rlcore: preset `{run.algorithm.preset}`, exact `kl/init` to θ0. TRL `GRPOTrainer`: `beta` {TRL_BETA} "
        f"(reference model), `num_generations` {ro.group_size}, {run.batch_size} completions per device batch,",
        "`steps_per_generation` 1, `num_iterations` 1, no vLLM, `bf16` off, gradient checkpointing off",
        "(rlcore does not recompute activations either), `optim` adamw_torch, `report_to` none, logging off.",
        f"Each round is a fresh subprocess: {args.warmup} warm-up steps, then {args.steps} timed steps; rounds",
        "interleaved rlcore, TRL, rlcore, TRL, …. Tokens: response tokens up to and including EOS (rlcore: its",
        "`response_mask`; TRL: the `completion_ids` its reward function receives). Time: rlcore's `time/step_s`;",
        "TRL: a `TrainerCallback` from `on_step_begin` to `on_step_end`. A round's tokens/s and ms/step are",
        'medians over its timed steps (of tokens / seconds, and of seconds). "others" is the CPU (in cores)',
        f"other processes used during the timed steps; rounds above {MAX_OTHERS} are contended, marked ✗ and",
        "left out of the medians (a competing process slows the two sides by very different factors).",
        "",
        "| pair | rlcore tokens/s | ms/step | tokens/step | others | TRL tokens/s | ms/step | tokens/step | others |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    pairs = zip(rounds[0::2], rounds[1::2], strict=True)
    for i, pair in enumerate(pairs, start=1):
        cells = [
            f"{r.tokens_per_s:,.0f} | {r.ms_per_step:.1f} | {r.tokens_per_step:.1f} | "
            f"{r.others:.2f}{'' if r.clean else ' ✗'}"
            for r in pair
        ]
        lines.append(f"| {i} | {' | '.join(cells)} |")
    lines += [
        f"| **median** | **{medians['rlcore']:,.0f}** | | | | **{medians['trl']:,.0f}** | | | |",
        "",
        f"Ratio rlcore / TRL (medians of tokens/s over uncontended rounds): **{ratio:.2f}×**; "
        f"target ≥ {args.target:.2f}×: **{outcome}**"
        + (f" (fewer than {args.rounds} uncontended rounds per side)." if outcome == "INCONCLUSIVE" else "."),
        "",
    ]
    return "\n".join(lines), outcome


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="uncontended rounds per side (interleaved)")
    parser.add_argument(
        "--max-pairs", type=int, default=10, help="give up (INCONCLUSIVE) after this many pairs"
    )
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps at the start of each round")
    parser.add_argument("--target", type=float, default=1.6, help="required rlcore / TRL tokens/s ratio")
    parser.add_argument("--cache-dir", type=Path, default=None, help="rlcore's tiny-model cache")
    parser.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        runner = run_rlcore if args.worker == "rlcore" else run_trl
        tokens, seconds, others = runner(args.warmup, args.steps, args.cache_dir)
        args.result.write_text(json.dumps({"tokens": tokens, "seconds": seconds, "others": others}))
        return 0

    rounds: list[Round] = []
    for pair in range(1, args.max_pairs + 1):
        for side in SIDES:
            done = run_round(side, args.warmup, args.steps, args.cache_dir)
            rounds.append(done)
            print(
                f"pair {pair} {side:>6}: {done.tokens_per_s:8,.0f} tokens/s, {done.ms_per_step:6.1f} ms/step, "
                f"others {done.others:.2f} cores{'' if done.clean else ' (contended)'}",
                flush=True,
            )
        if verdict(rounds, args.rounds, args.target)[2] != "INCONCLUSIVE":
            break
    section, outcome = report(rounds, args)
    sys.path.insert(0, str(ROOT))  # run as a script, bench/ itself is on the path, not the repo
    from bench.report import write_section

    write_section(section)
    print(section)
    print(outcome)
    return {"PASS": 0, "FAIL": 1}.get(outcome, 2)


if __name__ == "__main__":
    sys.exit(main())
