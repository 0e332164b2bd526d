"""Where a training run reports: metrics, example completions, its phase, and whether to stop.

The trainer only talks to a `Sink`. The worker's sink writes to Postgres, the CLI's
writes JSONL, tests keep everything in lists; rlcore never knows which.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Protocol

# What a run is doing, as reported through `Sink.phase` (names are part of the API).
PREPARING = "preparing"  # loading θ0 and building the optimiser
WARM_START = "warm_start"  # the tiny model's supervised warm start: step, max_steps, accuracy
TRAINING = "training"  # trainer step `step` of `steps`
EVALUATING = "evaluating"  # held-out evaluation at `step`
CHECKPOINTING = "checkpointing"  # writing the checkpoint of `step`
PHASES = (PREPARING, WARM_START, TRAINING, EVALUATING, CHECKPOINTING)


class Stopped(Exception):
    """The run was asked to stop (`Sink.should_stop`, e.g. cancelled) while it waited for something
    not its own step: a source's `take` (`rlcore.sources`), or the tiny model's warm start
    (`rlcore.models`)."""


@dataclass(frozen=True)
class Sample:
    """One example completion with its reward."""

    prompt: str
    completion: str
    reward: float


class Sink(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record the metrics of trainer step `step` (step 0 = before training)."""

    def sample(self, step: int, samples: list[Sample]) -> None:
        """Record example completions generated for step `step`."""

    def should_stop(self) -> bool:
        """Asked between steps; True ends the run early (cancellation)."""

    def flush(self) -> None:
        """Make everything reported so far durable; called right before a checkpoint is written."""

    def phase(self, name: str, **details: float) -> None:
        """The run entered phase `name` (one of `PHASES`), with numbers such as `step` and `steps`."""

    def provenance(self, record: dict[str, object]) -> None:
        """Where the run's numbers come from (`rlcore.provenance.record`), before anything is logged;
        a sink may refuse the run by raising (e.g. a θ0 other than its experiment's)."""

    def note(self, text: str) -> None:
        """Something the run had to work around that its owner should know (a damaged checkpoint
        skipped, say), in a sentence."""


def ignore_phase(name: str, **details: float) -> None:
    """A phase report nobody listens to: the default where reporting is optional."""


def never_stop() -> bool:
    """A stop request nobody makes: the default where stopping early is optional."""
    return False


@dataclass
class ListSink:
    """Keeps everything in memory; the sink for tests and notebooks."""

    points: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    samples: list[tuple[int, Sample]] = field(default_factory=list)
    phases: list[tuple[str, dict[str, float]]] = field(default_factory=list)
    stop_after_step: int | None = None
    record: dict[str, object] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.points.append((step, dict(metrics)))

    def sample(self, step: int, samples: list[Sample]) -> None:
        self.samples.extend((step, s) for s in samples)

    def should_stop(self) -> bool:
        last = max((step for step, _ in self.points), default=0)
        return self.stop_after_step is not None and last >= self.stop_after_step

    def flush(self) -> None:
        """Nothing to do: memory is all there is."""

    def phase(self, name: str, **details: float) -> None:
        self.phases.append((name, details))

    def provenance(self, record: dict[str, object]) -> None:
        self.record = dict(record)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def series(self, name: str) -> list[tuple[int, float]]:
        """(step, value) of one metric, in logging order."""
        return [(step, m[name]) for step, m in self.points if name in m]


class JsonlSink:
    """Appends one JSON object per line: {"provenance"} first, then {"step", "metrics"},
    {"step", "sample"}, {"phase", ...details} or {"note"}."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a")
        # Phases before the provenance record (preparing, the warm start) wait for it: it comes first.
        self._early_phases: list[str] | None = []

    def log(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: (v if math.isfinite(v) else str(v)) for k, v in metrics.items()}
        self._file.write(json.dumps({"step": step, "metrics": clean}) + "\n")
        self._file.flush()

    def sample(self, step: int, samples: list[Sample]) -> None:
        for s in samples:
            self._file.write(json.dumps({"step": step, "sample": asdict(s)}) + "\n")
        self._file.flush()

    def should_stop(self) -> bool:
        return False

    def flush(self) -> None:
        self._file.flush()

    def phase(self, name: str, **details: float) -> None:
        line = json.dumps({"phase": name, **details}) + "\n"
        if self._early_phases is not None:
            self._early_phases.append(line)
            return
        self._file.write(line)
        self._file.flush()

    def provenance(self, record: dict[str, object]) -> None:
        """The first line of a new file (a resumed run appends the resumed attempt's record)."""
        self._file.write(json.dumps({"provenance": record}) + "\n")
        self._file.writelines(self._early_phases or [])
        self._early_phases = None
        self._file.flush()

    def note(self, text: str) -> None:
        self._file.write(json.dumps({"note": text}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


# The valid tokens of a step's batch each masking mechanism acted on (docs/algorithms.md §7), part
# of STEP_METRICS: staleness mask, mismatch mask, sequence mask, clip.
MASKED_METRICS = (
    "masked_tokens/staleness",
    "masked_tokens/mismatch",
    "masked_tokens/sequence",
    "masked_tokens/clip",
)
# Logged at every trainer step (docs/algorithms.md §7); names are part of the API.
STEP_METRICS = (
    "reward/mean",
    "reward/std",
    "accuracy",
    "kl/init",
    "kl/init_k1",
    "kl/init_k3",
    "kl/behavior",
    "kl/behavior_k3",
    "kl/behavior_proximal",
    "staleness",
    "staleness/mean",
    "staleness/p50",
    "staleness/p95",
    "staleness/max",
    "policy_version",
    "clip_frac",
    "entropy",
    "is_ratio/mean",
    "is_ratio/min",
    "is_ratio/p01",
    "is_ratio/p50",
    "is_ratio/p99",
    "is_ratio/max",
    "ess_frac",
    "correction/masked_frac",
    "correction/weight_mean",
    *MASKED_METRICS,
    "kl/proximal",
    "optimizer_steps",
    "drop_frac",
    "response_length/mean",
    "grad_norm",
    "loss",
    "lr",
    "tokens_per_s",
    "time/step_s",
    "time/rollout_s",
    "time/wait_s",
    "time/update_s",
    "time/proximal_s",
    "time/queue_s",
)
# Logged at every step of an async run: its staleness split into the versions published while
# the batch was generated and those published while it waited to be trained (docs/algorithms.md §14).
ASYNC_METRICS = ("staleness/in_flight", "staleness/in_queue")
# The training–inference mismatch (docs/algorithms.md §14): at every step of a run whose engine can
# disagree with the trainer (`RunConfig.rescored`), else at the steps with on-policy rows.
MISMATCH_METRICS = (
    "mismatch/k1",
    "mismatch/k3",
    "mismatch/abs_max",
    "mismatch/drift_mean",
    "mismatch/drift_abs_mean",
)
# Logged at every step of a `bapo` run (docs/algorithms.md §16): the clip bounds its search chose and
# the balance s they reached (∞ without negative tokens), averaged over the step's mini-batches.
BAPO_METRICS = ("bapo/c_low", "bapo/c_high", "bapo/s")
# Logged at every step of an `m2po` run (docs/algorithms.md §7): the mean (p − μ)² over the valid
# tokens before its selection and over the tokens it kept.
M2PO_METRICS = ("m2po/m2_before", "m2po/m2_after")
# Logged at step 0 and every `eval_every` steps, and after the last step.
EVAL_METRICS = ("eval/accuracy", "eval/reward", "eval/kl_init")
# Every metric a run may log, in the order the comparison lists them.
ALL_METRICS = (*STEP_METRICS, *MISMATCH_METRICS, *ASYNC_METRICS, *BAPO_METRICS, *M2PO_METRICS, *EVAL_METRICS)
# The metrics whose latest value a run's summary carries (the trainer's, and the platform's for
# runs that ended without one).
SUMMARY_LATEST = ("eval/accuracy", "reward/mean", "kl/init")


@dataclass(frozen=True)
class Measured:
    """What a run's worker measured of its last attempt, carried in the run's summary beside the
    trainer's numbers: written by `workers.measure` (every run) and `workers.source` (distributed
    and async runs) through `stored`, read through `of` (`Run.measured`). Each field is stored
    under its name with its first "_" as "/" (`time_attempt_s` as "time/attempt_s",
    `MEASURED_KEYS`); the names are part of the API. None: not measured (a run stored before runs
    were measured, an attempt that failed, a machine without /proc, a simulated run's execution)."""

    # workers.measure: the attempt's wall-clock by part, seconds (docs/architecture.md, "Throughput").
    time_startup_s: float | None = None  # loading the config, imports
    time_warm_start_s: float | None = None  # θ0's warm start
    time_first_step_s: float | None = None
    time_steady_s: float | None = None  # the steps after the first
    time_eval_s: float | None = None
    time_checkpoint_s: float | None = None
    time_eval_steady_s: float | None = None  # the evaluations in the steady state
    time_checkpoint_steady_s: float | None = None
    time_attempt_s: float | None = None  # the whole attempt
    steps_steady: float | None = None
    tokens_total: float | None = None
    tokens_steady: float | None = None
    cpu_trainer_s: float | None = None  # the trainer's own process (all its ranks, for several)
    cpu_trainer_steady_s: float | None = None
    cpu_rollout_s: float | None = None  # the rollout jobs made for it
    cpu_rollout_steady_s: float | None = None
    threads_trainer: float | None = None  # torch threads (of all its ranks)
    machine_cores: float | None = None
    machine_others_cores: float | None = None  # cores other processes used meanwhile
    machine_contended: float | None = None  # 1.0: others used more than LAB_CONTENDED_CORES
    # workers.source: a distributed or async run's execution.
    weights_publish_s_mean: float | None = None
    weights_publish_bytes: float | None = None
    evals_trainer_parts: float | None = None  # eval parts the trainer made while it waited
    idle_trainer_frac: float | None = None  # of its wall-clock, blocked on a batch or an evaluation
    idle_rollout_frac: float | None = None  # of the rollout workers' wall-clock, in no job

    @classmethod
    def of(cls, summary: dict | None) -> Measured:
        """The measured fields of a run's summary (None where it has none)."""
        summary = summary or {}
        return cls(**{name: summary.get(key) for name, key in MEASURED_KEYS.items()})

    def stored(self) -> dict[str, float]:
        """The fields measured, under their keys in a run's summary, in the order declared."""
        return {
            key: value for name, key in MEASURED_KEYS.items() if (value := getattr(self, name)) is not None
        }

    @property
    def steady_steps(self) -> int:
        return int(self.steps_steady or 0)

    @property
    def contended(self) -> bool | None:
        """Whether the attempt ran contended; None when not measured."""
        return None if self.machine_contended is None else bool(self.machine_contended)


MEASURED_KEYS = {f.name: f.name.replace("_", "/", 1) for f in fields(Measured)}
