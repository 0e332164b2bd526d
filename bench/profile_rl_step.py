"""Where rlcore's trainer step time goes, on the settings of `bench/rl_step.py`.

Runs the real `rlcore.trainer.train` on `examples/arithmetic.yaml` (CPU, fp32, 2 threads)
with timers wrapped around the pieces of a step, without changing rlcore: generation
(`HFEngine.generate`, with its model forwards and `sample_next` separately), the training
forward (`score_responses` + `token_logprobs` of the policy), the frozen-θ0 forward (the
`score_responses` under inference mode), the loss, `backward`, grad clipping and the
optimiser step; outside them, the weight sync, prompt sampling and tokenising, decoding the
responses to text and the rewards. The rest of `train_step` (advantages, entropy and KL
metrics, scalar conversions) and the rest of the step are reported as remainders. Timers count
only during the steps after the warm-up (which start once the machine is idle, as in the
benchmark) and never during evaluation. Prints milliseconds per step of each part, its share
of `time/step_s`, and the CPU other processes used meanwhile (above ~0.2 cores, rerun).

    .venv/bin/python -m bench.profile_rl_step --steps 30
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from bench.rl_step import THREADS, Snapshot, bench_config, others_cores, snapshot, wait_until_idle
from rlcore import algorithms, models, rollout, sources, tasks, trainer
from rlcore.evaluate import Evaluator
from rlcore.sinks import ListSink

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


class Profiler:
    """Accumulates seconds per part while `active`."""

    def __init__(self, warmup: int):
        self.warmup = warmup
        self.step = 0
        self.evaluating = False
        self.totals: dict[str, float] = defaultdict(float)
        self.starts: dict[str, list[float]] = defaultdict(list)

    @property
    def active(self) -> bool:
        return self.step > self.warmup and not self.evaluating

    def begin(self, name: str) -> None:
        self.starts[name].append(time.perf_counter())

    def end(self, name: str) -> None:
        elapsed = time.perf_counter() - self.starts[name].pop()
        if self.active:
            self.totals[name] += elapsed

    def wrap(self, name: str | Callable[..., str], fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn` timed under `name`, or under `name(*args)` when `name` is a function."""

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            part = name(*args) if callable(name) else name
            self.begin(part)
            try:
                return fn(*args, **kwargs)
            finally:
                self.end(part)

        return wrapper

    def instrument(self) -> None:
        """Wrap rlcore's step pieces (module and class attributes, so `train` picks them up)."""
        publish = sources.LocalSource.publish

        def publish_counting(source: sources.LocalSource, version: int, policy: Any) -> None:
            self.step = version + 1
            publish(source, version, policy)

        sources.LocalSource.publish = publish_counting
        evaluate = Evaluator.evaluate

        def evaluate_untimed(*args: Any) -> dict[str, float]:
            self.evaluating = True
            try:
                return evaluate(*args)
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
        trainer.train_step = self.wrap("train_step", trainer.train_step)
        trainer.score_responses = self.wrap(
            lambda *_: "forward (policy)" if torch.is_grad_enabled() else "forward (θ0)",
            trainer.score_responses,
        )
        trainer.token_logprobs = self.wrap("forward (policy)", trainer.token_logprobs)
        algorithms.Algorithm.policy_loss = self.wrap("loss", algorithms.Algorithm.policy_loss)
        torch.Tensor.backward = self.wrap("backward", torch.Tensor.backward)
        torch.nn.utils.clip_grad_norm_ = self.wrap("clip grad norm", torch.nn.utils.clip_grad_norm_)
        register_optimizer_step_pre_hook(lambda *_: self.begin("optimizer step"))
        register_optimizer_step_post_hook(lambda *_: self.end("optimizer step"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
