"""What a run attempt cost, measured where it ran: its wall-clock per phase (start-up, θ0 warm
start, first step, steady steps, evaluations, checkpoints), its tokens, the CPU seconds of its
own process and of the rollout jobs made for it, its threads, and how many cores other processes
used on its machine meanwhile; above `LAB_CONTENDED_CORES` the attempt ran contended, and its
throughput says more about the machine's load than about the run (docs/architecture.md,
"Throughput")."""

from __future__ import annotations

import os
import platform
import time
from datetime import UTC, datetime
from pathlib import Path

from rlcore.sinks import CHECKPOINTING, EVALUATING, PREPARING, TRAINING, WARM_START, Measured

PROC_STAT = Path("/proc/stat")
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# A phase as reported by the trainer (`Sink.phase`) → the part of the wall-clock it counts in.
PARTS = {PREPARING: "startup", WARM_START: "warm_start", EVALUATING: "eval", CHECKPOINTING: "checkpoint"}


def machine_busy_s() -> float | None:
    """CPU seconds every process of this machine has been busy since boot (None without /proc)."""
    try:
        fields = PROC_STAT.read_text().split("\n", 1)[0].split()[1:9]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields)
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


class Measurement:
    """One attempt's clock: `phase` as the trainer reports it, `step` with each step's metrics,
    `report` at the end. Time before the first phase (loading the config, imports) is start-up."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.started_at = datetime.now(UTC)
        self.own_cpu_start = time.process_time()
        self.busy_start = machine_busy_s()
        self.parts: dict[str, float] = dict.fromkeys(
            ("startup", "warm_start", "first_step", "steady", "eval", "checkpoint"), 0.0
        )
        self.current, self.since = "startup", self.started
        self.first_step: int | None = None
        self.steady_steps = 0
        self.tokens = self.steady_tokens = 0.0
        # When the first steady step began (the steady state: every step after the first):
        # the parts and this process's CPU time then, and the time for the rollout jobs since.
        self.steady_from: dict[str, float] | None = None
        self.steady_cpu_from = 0.0
        self.steady_started_at: datetime | None = None
        self.stopped: float | None = None  # `stop`: when training ended
        self.stopped_cpu = 0.0

    def phase(self, name: str, step: int | None = None) -> None:
        now = time.perf_counter()
        self.parts[self.current] += now - self.since
        if name == TRAINING:
            if self.first_step is None:
                self.first_step = step
            part = "first_step" if step == self.first_step else "steady"
            self.steady_steps += part == "steady"
            if part == "steady" and self.steady_from is None:
                self.steady_from = dict(self.parts)
                self.steady_cpu_from = time.process_time()
                self.steady_started_at = datetime.now(UTC)
        else:
            part = PARTS.get(name, self.current)
        self.current, self.since = part, now

    def stop(self) -> None:
        """The attempt's training is over: the clock stops (storing what is left is not training)."""
        if self.stopped is None:
            self.stopped = time.perf_counter()
            self.stopped_cpu = time.process_time()

    def step(self, step: int, metrics: dict[str, float]) -> None:
        """Count a trainer step's tokens (its `tokens_per_s` × `time/step_s`)."""
        if "tokens_per_s" not in metrics or "time/step_s" not in metrics:
            return
        tokens = metrics["tokens_per_s"] * metrics["time/step_s"]
        self.tokens += tokens
        if step != self.first_step:
            self.steady_tokens += tokens

    def report(self, rollout_jobs: list[tuple[str, float, datetime]]) -> dict[str, float]:
        """The attempt's numbers, flat, for the run's summary (`rlcore.sinks.Measured`: `time/<part>_s`,
        and `_steady_s` for evaluations and checkpoints in the steady state). `rollout_jobs`: (worker, CPU seconds,
        finished) of the rollout jobs made for the attempt; those made on this machine are the
        run's own work there, not other processes'."""
        from django.conf import settings

        self.stop()
        now, cpu_now = self.stopped, self.stopped_cpu
        parts = dict(self.parts)
        parts[self.current] += now - self.since
        wall = now - self.started
        own_cpu = cpu_now - self.own_cpu_start
        steady_from = self.steady_from or parts

        def steady(finished: datetime) -> bool:
            return self.steady_started_at is not None and finished >= self.steady_started_at

        measured = {f"time_{name}_s": seconds for name, seconds in parts.items()}
        measured |= {
            "time_eval_steady_s": parts["eval"] - steady_from["eval"],
            "time_checkpoint_steady_s": parts["checkpoint"] - steady_from["checkpoint"],
            "time_attempt_s": wall,
            "steps_steady": float(self.steady_steps),
            "tokens_total": self.tokens,
            "tokens_steady": self.steady_tokens,
            "cpu_trainer_s": own_cpu,
            "cpu_trainer_steady_s": cpu_now - self.steady_cpu_from if self.steady_from else 0.0,
            "cpu_rollout_s": sum(cpu_s for _, cpu_s, _ in rollout_jobs),
            "cpu_rollout_steady_s": sum(cpu_s for _, cpu_s, finished in rollout_jobs if steady(finished)),
            "threads_trainer": float(_torch_threads()),
            "machine_cores": float(os.cpu_count() or 0),
        }
        here = f"{platform.node()}:"
        rollout_cpu_here_s = sum(cpu_s for worker, cpu_s, _ in rollout_jobs if worker.startswith(here))
        busy = machine_busy_s()
        if busy is not None and self.busy_start is not None and wall > 0:
            # Up to now, not to `stop`: the machine's and this process's CPU time alike.
            own_now = time.process_time() - self.own_cpu_start
            elapsed = time.perf_counter() - self.started
            others = max(0.0, busy - self.busy_start - own_now - rollout_cpu_here_s) / elapsed
            measured["machine_others_cores"] = others
            measured["machine_contended"] = float(others > settings.LAB_CONTENDED_CORES)
        return Measured(**measured).stored()


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()
