"""Where rlcore's trainer step time goes, on the settings of `bench/rl_step.py`.

Runs the real `rlcore.trainer.train` on `examples/arithmetic.yaml` (CPU, fp32) with timers wrapped
around the pieces of a step, without changing rlcore: generation (`HFEngine.generate`, with its
model forwards and `sample_next` separately), the training forward (`score_responses` +
`token_logprobs` of the policy), the frozen-θ0 forward (the `score_responses` under inference
mode), the loss, `backward`, grad clipping and the optimiser step; outside them, the weight sync,
prompt sampling and tokenising, decoding the responses to text and the rewards. Timers count only
during the steps after the warm-up and never during evaluation.

Two clocks:

- wall (the default): 2 threads, as the benchmark; the timed steps start once the machine is
  idle. Prints milliseconds per step of each part, its share of `time/step_s`, and the CPU other
  processes used meanwhile (above ~0.2 cores, rerun).
- `--cpu`: the CPU time of the trainer's process (`time.process_time`) with 1 torch thread, which
  other processes on a shared machine move far less than wall time (a part's CPU time is its own,
  though a process sharing its core or caches still slows it). Each part is counted on its own (a part inside another is left out of the outer
  one), and the step's diagnostics get rows of their own: the ratio diagnostics
  (`Algorithm.statistics`), the masked-token counts, the pass over the batch that computes the
  loss again for the metrics, the entropy and kl/init sums (without θ0's forward), mismatch/*,
  M2PO's moments and the step's other scalars. Rounds are fresh subprocesses; with `--baseline
  REF` they alternate between REF's `rlcore` (from git) and this tree's, and the table gives
  both (a row: the median over a round's timed steps, then over the rounds); `--write` puts it
  into BENCHMARKS.md.

    .venv/bin/python -m bench.profile_rl_step --steps 30
    .venv/bin/python -m bench.profile_rl_step --cpu --baseline main --rounds 3 --write
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
import tarfile
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from io import BytesIO
from pathlib import Path
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

# bench/rl_step.py imports bench/report.py as `report`, from beside it.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench.report import machine, write_section  # noqa: E402
from bench.rl_step import (  # noqa: E402
    EXAMPLE,
    ROOT,
    THREADS,
    Snapshot,
    bench_config,
    others_cores,
    snapshot,
    wait_until_idle,
)

SECTION = "## What the RL step spends (`bench/profile_rl_step.py --cpu`)"
STEP_PARTS = (
    "weight sync (HFEngine.sync)",
    "prompt sampling (Task.sample)",
    "tokenising prompts (LoadedModel.encode)",
    "decoding responses (LoadedModel.decode_responses)",
    "rewards (Task.score)",
)
TRAIN_STEP_PARTS = (
    "forward (policy)",
    "forward (θ0)",
    "loss",
    "backward",
    "clip grad norm",
    "optimizer step",
)
LOSS_UPDATE = "loss"
LOSS_METRICS = "metrics pass (policy_loss over the batch again)"
# The step's diagnostics, each timed on its own (`--cpu`): (row, what it computes).
DIAGNOSTICS = (
    (
        "ratio diagnostics (Algorithm.statistics)",
        "clip_frac, is_ratio/*, ess_frac, correction/*, kl/behavior, kl/behavior_k3 (and, after the "
        "change, the masked-token counts' read), per call",
    ),
    ("masked-token counts (masked_tokens / masked_counts)", "masked_tokens/*"),
    (
        LOSS_METRICS,
        "the loss, ratios, surrogate and correction computed again over the whole batch for `loss` "
        "and the rows above (before: every step; after: only where the update's own loss is not "
        "the step's: several optimiser steps or micro-batches, trainer ranks, BAPO)",
    ),
    (
        "entropy and kl/init sums (_Pass._add_sums + totals, without θ0's forward)",
        "entropy, kl/init, kl/init_k1, kl/init_k3",
    ),
    ("mismatch/* (trainer.mismatch)", "mismatch/k1|k3|abs_max|drift_mean|drift_abs_mean"),
    ("M2PO's moments (algorithms.second_moments)", "m2po/m2_before|m2_after (m2po runs only)"),
    (
        "the step's other scalars (trainer.step_scalars)",
        "reward/*, accuracy, kl/behavior_proximal, kl/proximal, staleness/*, drop_frac, "
        "response_length/mean (before: inline in train_step, in its rest)",
    ),
)


class Profiler:
    """Accumulates seconds per part while `active`, on `clock`: each part's total (`totals`) and
    its own time without the parts timed inside it (`own`)."""

    def __init__(self, warmup: int, clock: Callable[[], float] = time.perf_counter):
        self.warmup = warmup
        self.clock = clock
        self.step = 0
        self.evaluating = False
        self.totals: dict[str, float] = defaultdict(float)
        self.own: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        # Per timed step: each part's total and own seconds.
        self.steps: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.steps_own: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.stack: list[list[Any]] = []  # [name, started, seconds of the parts inside]

    @property
    def active(self) -> bool:
        return self.step > self.warmup and not self.evaluating

    def begin(self, name: str) -> None:
        self.stack.append([name, self.clock(), 0.0])

    def end(self, name: str) -> None:
        index = max(i for i, frame in enumerate(self.stack) if frame[0] == name)
        _, started, inside = self.stack.pop(index)
        elapsed = self.clock() - started
        if index > 0:
            self.stack[index - 1][2] += elapsed
        if self.active:
            self.totals[name] += elapsed
            self.own[name] += elapsed - inside
            self.calls[name] += 1
            self.steps[self.step][name] += elapsed
            self.steps_own[self.step][name] += elapsed - inside

    def wrap(self, name: str | Callable[..., str], fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn` timed under `name`, or under `name(*args, **kwargs)` when `name` is a function."""

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            part = name(*args, **kwargs) if callable(name) else name
            self.begin(part)
            try:
                return fn(*args, **kwargs)
            finally:
                self.end(part)

        return wrapper

    def instrument(self, diagnostics: bool = False) -> None:
        """Wrap rlcore's step pieces (module and class attributes, so `train` picks them up); with
        `diagnostics`, the step's metric computations too (whichever of them this rlcore has)."""
        from rlcore import algorithms, models, rollout, sources, tasks, trainer
        from rlcore.evaluate import Evaluator

        publish = sources.LocalSource.publish

        def publish_counting(source: sources.LocalSource, version: int, policy: Any) -> None:
            self.step = version + 1
            publish(source, version, policy)

        sources.LocalSource.publish = publish_counting
        evaluate = Evaluator.evaluate

        def evaluate_untimed(*args: Any, **kwargs: Any) -> dict[str, float]:
            self.evaluating = True
            try:
                return evaluate(*args, **kwargs)
            finally:
                self.evaluating = False

        Evaluator.evaluate = evaluate_untimed
        engine_init = rollout.HFEngine.__init__

        def engine_init_hooked(engine: rollout.HFEngine, *args: Any) -> None:
            engine_init(engine, *args)
            engine.model.register_forward_pre_hook(lambda *_: self.begin("generate: model forward"))
            engine.model.register_forward_hook(lambda *_: self.end("generate: model forward"))

        rollout.HFEngine.__init__ = engine_init_hooked
        rollout.HFEngine.sync = self.wrap(STEP_PARTS[0], rollout.HFEngine.sync)
        tasks.Task.sample = self.wrap(STEP_PARTS[1], tasks.Task.sample)
        models.LoadedModel.encode = self.wrap(STEP_PARTS[2], models.LoadedModel.encode)
        models.LoadedModel.decode_responses = self.wrap(STEP_PARTS[3], models.LoadedModel.decode_responses)
        tasks.Arithmetic.score = self.wrap(STEP_PARTS[4], tasks.Arithmetic.score)
        rollout.HFEngine.generate = self.wrap("generate", rollout.HFEngine.generate)
        rollout.sample_next = self.wrap("generate: sample_next", rollout.sample_next)
        trainer.run_step = self.wrap("step", trainer.run_step)
        trainer.train_step = self.wrap("train_step", trainer.train_step)
        trainer.score_responses = self.wrap(
            lambda *_, **__: "forward (policy)" if torch.is_grad_enabled() else "forward (θ0)",
            trainer.score_responses,
        )
        trainer.token_logprobs = self.wrap("forward (policy)", trainer.token_logprobs)
        algorithms.Algorithm.policy_loss = self.wrap(
            lambda _, logp, *__, **___: LOSS_UPDATE if logp.requires_grad else LOSS_METRICS,
            algorithms.Algorithm.policy_loss,
        )
        torch.Tensor.backward = self.wrap("backward", torch.Tensor.backward)
        torch.nn.utils.clip_grad_norm_ = self.wrap("clip grad norm", torch.nn.utils.clip_grad_norm_)
        register_optimizer_step_pre_hook(lambda *_: self.begin("optimizer step"))
        register_optimizer_step_post_hook(lambda *_: self.end("optimizer step"))
        if not diagnostics:
            return
        rows = [row for row, _ in DIAGNOSTICS]
        if hasattr(algorithms.Algorithm, "statistics"):
            timed = self.wrap(rows[0], algorithms.Algorithm.statistics)
            algorithms.Algorithm.statistics = staticmethod(timed)
        for module, names, row in (
            (algorithms, ("masked_tokens", "masked_counts"), rows[1]),
            (algorithms, ("second_moments",), rows[5]),
            (trainer, ("mismatch",), rows[4]),
            (trainer, ("step_scalars",), rows[6]),
        ):
            for attribute in names:
                if hasattr(module, attribute):
                    setattr(module, attribute, self.wrap(row, getattr(module, attribute)))
        holder = getattr(trainer, "_Pass", trainer)  # an older rlcore: functions of the trainer module
        for attribute in ("_add_sums", "totals"):
            if hasattr(holder, attribute):
                setattr(holder, attribute, self.wrap(rows[3], getattr(holder, attribute)))


def wall_profile(args: argparse.Namespace) -> None:
    """The wall-clock breakdown, with 2 threads on an idle machine (the benchmark's conditions)."""
    from rlcore import trainer
    from rlcore.sinks import ListSink

    torch.set_num_threads(THREADS)
    profiler = Profiler(args.warmup)
    profiler.instrument()
    run = bench_config(args.warmup + args.steps)
    window: list[Snapshot] = []

    class WaitingSink(ListSink):
        """Waits for an idle machine between the warm-up and the timed steps (outside any step)."""

        def log(self, step: int, metrics: dict[str, float]) -> None:
            super().log(step, metrics)
            if step == args.warmup:
                window.append(wait_until_idle())

    sink = WaitingSink()
    trainer.train(run, sink)
    others = others_cores(window[0], snapshot())

    timed = [(s, t) for (s, t) in sink.series("time/step_s") if s > args.warmup]
    lengths = [length for s, length in sink.series("response_length/mean") if s > args.warmup]
    step_s = sum(t for _, t in timed)
    tokens = sum(lengths) * run.batch_size
    n = len(timed)
    ms = {name: 1000 * seconds / n for name, seconds in profiler.totals.items()}
    step_ms = 1000 * step_s / n
    generate_ms, train_step_ms = ms["generate"], ms["train_step"]
    rows = [
        ("generate (HFEngine.generate)", generate_ms),
        ("  of which model forwards (prefill + decode steps)", ms.get("generate: model forward", 0.0)),
        ("  of which sample_next", ms.get("generate: sample_next", 0.0)),
        *((name, ms.get(name, 0.0)) for name in STEP_PARTS),
        (
            "rest of the step (outside generate and train_step)",
            step_ms - train_step_ms - generate_ms - sum(ms.get(name, 0.0) for name in STEP_PARTS),
        ),
        *((name, ms.get(name, 0.0)) for name in TRAIN_STEP_PARTS),
        (
            "rest of train_step (advantages, entropy/KL metrics, scalars)",
            train_step_ms - sum(ms.get(name, 0.0) for name in TRAIN_STEP_PARTS),
        ),
    ]
    print(
        f"{n} timed steps: {step_ms:.1f} ms/step, {tokens / step_s:,.0f} tokens/s, {tokens / n:.1f} tokens/step; "
        f"other processes used {others:.2f} cores meanwhile"
    )
    for name, value in rows:
        print(f"{name:<62} {value:7.1f} ms  {100 * value / step_ms:5.1f}%")


# ----- --cpu: CPU time per part, 1 thread, rounds in subprocesses ---------------------------------


def cpu_rows(total: dict[str, float], own: dict[str, float]) -> dict[str, float]:
    """The table's rows (ms) from each part's total and own time (ms) over the same steps."""
    diagnostics = [row for row, _ in DIAGNOSTICS]
    inside_train_step = (*TRAIN_STEP_PARTS, *diagnostics)
    return {
        "step (trainer.run_step)": total["step"],
        "generate (HFEngine.generate)": total["generate"],
        **{name: own.get(name, 0.0) for name in STEP_PARTS},
        "rest of the step": total["step"]
        - total["train_step"]
        - total["generate"]
        - sum(own.get(name, 0.0) for name in STEP_PARTS),
        "train_step": total["train_step"],
        **{name: own.get(name, 0.0) for name in inside_train_step},
        "rest of train_step": total["train_step"] - sum(own.get(name, 0.0) for name in inside_train_step),
        "diagnostics, all": sum(own.get(name, 0.0) for name in diagnostics),
    }


def cpu_round(warmup: int, steps: int) -> dict[str, Any]:
    """One round in this process: each row's CPU ms per step, the median over the timed steps (a
    step another process slowed down moves a median little), and the round's facts."""
    from rlcore import trainer
    from rlcore.sinks import ListSink

    torch.set_num_threads(1)
    profiler = Profiler(warmup, time.process_time)
    profiler.instrument(diagnostics=True)
    run = bench_config(warmup + steps)
    sink = ListSink()
    try:
        started = snapshot()
    except ImportError:  # an older rlcore than workers.measure reads: the contention goes unmeasured
        started = None
    trainer.train(run, sink)
    others = math.nan if started is None else others_cores(started, snapshot())
    per_step = [
        cpu_rows(
            {name: 1000 * seconds for name, seconds in profiler.steps[step].items()},
            {name: 1000 * seconds for name, seconds in profiler.steps_own[step].items()},
        )
        for step in sorted(profiler.steps)
    ]
    n = len(per_step)
    timed = [t for s, t in sink.series("time/step_s") if s > warmup]
    lengths = [length for s, length in sink.series("response_length/mean") if s > warmup]
    return {
        "rows": {row: statistics.median(step[row] for step in per_step) for row in per_step[0]},
        "calls": {row: profiler.calls.get(row, 0) / n for row, _ in DIAGNOSTICS},
        "steps": n,
        "others": others,
        "tokens_per_step": statistics.fmean(lengths) * run.batch_size,
        "wall_ms": 1000 * statistics.median(timed),
    }


def checkout(ref: str, into: Path) -> str:
    """REF's `rlcore` package, from git, into `into`; returns REF's short commit."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", ref], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    archive = subprocess.run(["git", "archive", commit, "rlcore"], cwd=ROOT, capture_output=True, check=True)
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return commit


def this_tree() -> str:
    """This tree's short commit, marked when it has uncommitted changes to `rlcore`."""
    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
    dirty = subprocess.run([*git, "status", "--porcelain", "rlcore"], capture_output=True, text=True).stdout
    return commit.strip() + (" with uncommitted changes" if dirty.strip() else "")


def run_cpu_round(rlcore_root: Path, warmup: int, steps: int) -> dict[str, Any]:
    """One `cpu_round` in a fresh subprocess importing `rlcore` from `rlcore_root`."""
    path = [str(rlcore_root), str(ROOT), str(ROOT / "platform"), os.environ.get("PYTHONPATH", "")]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join(filter(None, path)),
    }
    with tempfile.NamedTemporaryFile(suffix=".json") as result:
        command = [sys.executable, "-m", "bench.profile_rl_step", "--cpu-worker", result.name]
        command += ["--warmup", str(warmup), "--steps", str(steps)]
        # `-m` puts the working directory first on the path: there, `rlcore_root`'s rlcore is found.
        done = subprocess.run(command, env=env, cwd=rlcore_root, capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stdout + done.stderr)
            raise RuntimeError(f"a round failed (exit {done.returncode})")
        return json.loads(Path(result.name).read_text())


def cpu_profile(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"now": (ROOT, this_tree())}
        if args.baseline:
            sides = {"before": (Path(tmp), checkout(args.baseline, Path(tmp))), **sides}
        rounds: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
        for i in range(1, args.rounds + 1):
            for side, (root, _) in sides.items():
                done = run_cpu_round(root, args.warmup, args.steps)
                rounds[side].append(done)
                print(
                    f"round {i} {side:>6}: {done['rows']['step (trainer.run_step)']:.1f} CPU ms/step, "
                    f"diagnostics {done['rows']['diagnostics, all']:.2f} ms, "
                    f"others {done['others']:.2f} cores",
                    flush=True,
                )
    section = cpu_report(args, {side: commit for side, (_, commit) in sides.items()}, rounds)
    if args.write:
        write_section(section)
    print(section)


def cpu_report(args: argparse.Namespace, commits: dict[str, str], rounds: dict[str, list[dict]]) -> str:
    """The markdown section: CPU ms per step of each row, median over the rounds, per side."""
    medians = {
        side: {row: statistics.median(r["rows"][row] for r in done) for row in done[0]["rows"]}
        for side, done in rounds.items()
    }
    calls = {
        side: {row: statistics.median(r["calls"][row] for r in done) for row in done[0]["calls"]}
        for side, done in rounds.items()
    }
    sides = list(rounds)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    run = bench_config(args.warmup + args.steps)
    ro = run.rollout
    described = {
        "before": f"before: `{args.baseline}` ({commits.get('before', '')})",
        "now": f"now: this tree ({commits['now']})",
    }
    lines = [
        SECTION,
        "",
        f"Measured {now} on {machine()}.",
        "",
        f"The real `rlcore.trainer.train` on `{EXAMPLE.relative_to(ROOT)}`'s settings as `bench/rl_step.py` "
        f"runs them (preset `{run.algorithm.preset}`, {ro.prompts_per_step} prompts × {ro.group_size} "
        f"responses, `max_new_tokens` {ro.max_new_tokens}, {run.model.dtype}, CPU, one optimiser step per "
        "trainer step), timers wrapped around the step's parts. Time: the CPU time of the trainer's "
        "process (`time.process_time`) with **1 torch thread**, per step, which other processes on a "
        "shared machine move far less than wall time (wall time with 2 threads is `bench/rl_step.py`'s; "
        "there the model's forwards and backward run on both cores, the diagnostics, small tensors and "
        "Python, on one). It still varies from round to round, by up to ±15% on an idle machine (other "
        "processes on the core or its caches, the host): compare a change against the rows the change "
        "did not touch. "
        "Each part is counted on its own (a part timed inside another is left out of it). "
        f"{args.rounds} rounds per side, each a fresh subprocess of {args.warmup} warm-up and {args.steps} "
        "timed steps, sides alternating; a row is the median over a round's timed steps, then over the "
        f"rounds. {'; '.join(described[s] for s in sides)}.",
        "",
        "| part | "
        + " | ".join(f"{side} CPU ms/step" for side in sides)
        + (" | change |" if len(sides) > 1 else " |"),
        "|---|" + "---|" * len(sides) + ("---|" if len(sides) > 1 else ""),
    ]
    diagnostics = {row: what for row, what in DIAGNOSTICS}
    for row in medians[sides[-1]]:
        values = [medians[side][row] for side in sides]
        label = row
        if row in diagnostics:
            per_call = ", ".join(f"{calls[side][row]:g}" for side in sides)
            label = f"  diagnostics: {row}: {diagnostics[row]} (calls per step: {per_call})"
        elif row in TRAIN_STEP_PARTS or row == "rest of train_step":
            label = f"  {row}"
        cells = [f"{v:.2f}" for v in values]
        if len(sides) > 1:
            cells.append(f"{values[1] - values[0]:+.2f}")
        bold = row in ("step (trainer.run_step)", "diagnostics, all")
        lines.append(f"| {'**' + label + '**' if bold else label} | {' | '.join(cells)} |")
    lines.append("")
    facts = [
        f"{side}: {statistics.median(r['tokens_per_step'] for r in rounds[side]):.1f} tokens/step, "
        f"wall {statistics.median(r['wall_ms'] for r in rounds[side]):.1f} ms/step, other processes "
        + "/".join(f"{r['others']:.2f}" for r in rounds[side])
        + " cores"
        for side in sides
    ]
    lines.append(
        "Rounds (medians; wall with 1 thread, not a throughput figure; the CPU other processes used "
        "during each round, which slows this process's CPU time too where they share a core): "
        + "; ".join(facts)
        + "."
    )
    if len(sides) > 1:
        before, after = (medians[side]["step (trainer.run_step)"] for side in sides)
        lines += [
            "",
            f"The step's CPU: **{before:.1f} → {after:.1f} ms** ({after - before:+.1f} ms, "
            f"{100 * (after - before) / before:+.1f}%); the diagnostics: "
            f"{medians[sides[0]]['diagnostics, all']:.2f} → {medians[sides[1]]['diagnostics, all']:.2f} ms.",
        ]
    shares = []
    for side in sides:
        rows = medians[side]
        model = sum(rows[name] for name in ("generate (HFEngine.generate)", *TRAIN_STEP_PARTS))
        step_ms = rows["step (trainer.run_step)"]
        shares.append(
            f"{side}: the diagnostics {100 * rows['diagnostics, all'] / step_ms:.1f}% of the step's CPU, "
            f"generation, the forwards, backward, clip and optimiser step {100 * model / step_ms:.1f}%"
        )
    lines += ["", "Shares: " + "; ".join(shares) + "."]
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument(
        "--cpu", action="store_true", help="CPU time per part, 1 thread, rounds in subprocesses"
    )
    parser.add_argument("--baseline", help="with --cpu: also measure this git ref's rlcore, alternating")
    parser.add_argument("--rounds", type=int, default=3, help="with --cpu: rounds per side")
    parser.add_argument(
        "--write", action="store_true", help="with --cpu: write the section into BENCHMARKS.md"
    )
    parser.add_argument("--cpu-worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cpu_worker:
        args.cpu_worker.write_text(json.dumps(cpu_round(args.warmup, args.steps)))
    elif args.cpu:
        cpu_profile(args)
    else:
        wall_profile(args)


if __name__ == "__main__":
    main()
