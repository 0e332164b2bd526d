"""What a run attempt cost, measured where it ran: its wall-clock per phase (start-up, θ0 warm
start, first step, steady steps, evaluations, checkpoints), its tokens, the CPU seconds of its
own process (with its fellow trainer ranks', for a run in several) and of the rollout jobs made
for it, its threads, and how many cores other processes
used on its machine meanwhile; above `LAB_CONTENDED_CORES` the attempt ran contended, and its
throughput says more about the machine's load than about the run (docs/architecture.md,
"Throughput")."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
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


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) process `pid` has used so far (None once it is gone, or without /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime: the stat's 14th and 15th
    except (OSError, IndexError, ValueError):
        return None


def sibling_pids() -> list[int]:
    """The other processes this process's parent started: a trainer rank's fellow ranks under torchrun."""
    parent, me, found = os.getppid(), os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


class Measurement:
    """One attempt's clock: `phase` as the trainer reports it, `step` with each step's metrics,
    `report` at the end. Time before the first phase (loading the config, imports) is start-up.

    `others` (called at the first phase, when they all run) names processes whose CPU time counts
    as the trainer's beside this one's: rank 0's fellow ranks (`sibling_pids`). Their CPU is
    counted from then, their threads beside this process's; a process that has ended keeps its
    last reading, so `stop` is best called while they all still run."""

    def __init__(self, others: Callable[[], list[int]] | None = None) -> None:
        self.started = time.perf_counter()
        self.started_at = datetime.now(UTC)
        self.others = others
        self.other_cpu: dict[int, tuple[float, float]] = {}  # pid → (first reading, last reading)
        self.own_cpu_start = self.cpu_s()
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

    def cpu_s(self) -> float:
        """The trainer's CPU seconds so far: this process's, plus what the others used since the
        first phase."""
        total = time.process_time()
        for pid, (first, last) in self.other_cpu.items():
            now = process_cpu_s(pid)
            last = last if now is None else now
            self.other_cpu[pid] = (first, last)
            total += last - first
        return total

    def phase(self, name: str, step: int | None = None) -> None:
        if self.others is not None:
            found, self.others = self.others(), None
            self.other_cpu = {pid: (cpu, cpu) for pid in found if (cpu := process_cpu_s(pid)) is not None}
        now = time.perf_counter()
        self.parts[self.current] += now - self.since
        if name == TRAINING:
            if self.first_step is None:
                self.first_step = step
            part = "first_step" if step == self.first_step else "steady"
            self.steady_steps += part == "steady"
            if part == "steady" and self.steady_from is None:
                self.steady_from = dict(self.parts)
                self.steady_cpu_from = self.cpu_s()
                self.steady_started_at = datetime.now(UTC)
        else:
            part = PARTS.get(name, self.current)
        self.current, self.since = part, now

    def stop(self) -> None:
        """The attempt's training is over: the clock stops (storing what is left is not training)."""
        if self.stopped is None:
            self.stopped = time.perf_counter()
            self.stopped_cpu = self.cpu_s()

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
            "threads_trainer": float(_torch_threads() * (1 + len(self.other_cpu))),
            "machine_cores": float(os.cpu_count() or 0),
        }
        here = f"{platform.node()}:"
        rollout_cpu_here_s = sum(cpu_s for worker, cpu_s, _ in rollout_jobs if worker.startswith(here))
        busy = machine_busy_s()
        if busy is not None and self.busy_start is not None and wall > 0:
            # Up to now, not to `stop`: the machine's and this process's CPU time alike.
            own_now = self.cpu_s() - self.own_cpu_start
            elapsed = time.perf_counter() - self.started
            others = max(0.0, busy - self.busy_start - own_now - rollout_cpu_here_s) / elapsed
            measured["machine_others_cores"] = others
            measured["machine_contended"] = float(others > settings.LAB_CONTENDED_CORES)
        return Measured(**measured).stored()


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()
