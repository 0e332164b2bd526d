"""`DatabaseSource`: the trainer's batches come from rollout jobs on other workers.

`publish(version, policy)` writes the weights of `version` to the run's buffer folder (every
worker reads it) and records them as a `PolicyVersion`, then creates the rollout jobs that
version allows and sends them to the run's rollout queue:
- distributed: the jobs of the steps whose scheduled behaviour version v(t) is `version`,
  as many at once as the schedule allows (`sync_offset` runs ahead, `sync_interval` batches
  ahead). Curves equal the simulated ones.
- async: the jobs of every step up to `version + 1 + max_staleness`; a rollout worker
  generates each with the newest weights published when it claims it. A job is never created
  while its batch could end up more than `max_staleness` versions behind when trained
  (AReaL's admission rule), so nothing is ever dropped.

`take(step)` waits for the step's jobs to be done and reads their batch files.

Held-out evaluations run on the rollout workers too, as Trinity-RFT's explorer runs them:
`evaluate(step, learner)` publishes version `step` and creates its eval jobs (one in
distributed execution, computing exactly what the trainer would; in async, parts of about half
a batch each, which a rollout worker fits in between batches); `evaluations()` hands the
trainer the evaluations whose parts are all done, to log at their step. The trainer does not
wait for an evaluation, except for the ones still out when its last step is done. The buffer
(weights and batch files) is durable: a trainer resumed after its worker died finds every
batch already made, and a lost rollout job is simply made again. Every database call rides
out a short outage (`retry_db`); publishing records a version and its jobs in one transaction,
retried whole.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from django.db import transaction
from django.db.models import Max, Q
from experiments.models import PolicyVersion, RolloutJob, Run

from rlcore.batch import Batch
from rlcore.config import RunConfig
from rlcore.staleness import Stopped, behavior_version, steps_by_version
from rlcore.trainer import EvalSums, Learner
from rlcore.weights import Published, WeightStore
from workers.db_outage import retry_db

log = logging.getLogger(__name__)

# How often a waiting trainer looks for its batch: a short wait here is a step's idle time.
POLL_S = 0.005
MAX_POLL_S = 0.02
STOP_CHECK_S = 0.5
GIVEN_UP = (RolloutJob.FAILED, RolloutJob.LOST, RolloutJob.CANCELLED)


def group_slices(groups: int, parts: int) -> list[range]:
    """`groups` prompt groups split into `parts` consecutive slices, sizes differing by at most one."""
    bounds = [round(i * groups / parts) for i in range(parts + 1)]
    return [range(lo, hi) for lo, hi in zip(bounds, bounds[1:], strict=False)]


def eval_slices(config: RunConfig) -> list[range]:
    """The held-out problems of one evaluation split into eval jobs: distributed, one job (the
    trainer's evaluation exactly); async, parts of about half a batch's sequences (a part
    decodes each problem twice, greedy and sampled), so that a rollout worker fits them in
    between the batches it makes and the trainer never waits on a whole evaluation."""
    if config.execution.mode != "async":
        return [range(config.eval_size)]
    per_part = max(1, config.rollout.prompts_per_step * config.rollout.group_size // 2)
    return group_slices(config.eval_size, max(1, -(-config.eval_size // per_part)))


def weight_store(run: Run) -> WeightStore:
    return WeightStore(run.buffer_dir / "weights")


def batch_path(run: Run, step: int, part: int, attempt: int) -> Path:
    """One file per attempt: a late attempt never overwrites the bytes another one recorded."""
    return run.buffer_dir / "batches" / f"step-{step:06d}-part-{part:02d}-attempt-{attempt}.safetensors"


def newest_version(run: Run) -> PolicyVersion | None:
    return PolicyVersion.objects.filter(run=run).order_by("-version").first()


def clear_buffer(run: Run) -> None:
    """The run is over: its published weights and batch files go."""
    shutil.rmtree(run.buffer_dir, ignore_errors=True)


class DatabaseSource:
    """A `BatchSource` whose batches are made by rollout jobs (rows in the database)."""

    def __init__(self, run: Run, config: RunConfig, should_stop: Callable[[], bool]):
        self.run = run
        self.config = config
        self.mode = config.execution.mode
        self.should_stop = should_stop
        self.store = weight_store(run)
        self.slices = group_slices(config.rollout.prompts_per_step, config.execution.rollout_workers)
        self.eval_slices = eval_slices(config)
        self.evals_logged: set[int] = set()  # a new attempt logs every done evaluation again
        self._published: tuple[int, Published] | None = None  # the last version written
        s = config.staleness
        self._steps_of = steps_by_version(config.steps, s.sync_interval, s.sync_offset, s.offline)
        self.last_taken = 0
        self.checkpointed = 0  # the step of the last checkpoint whose state() we gave
        self.started: float | None = None  # the first publish: loading θ0 is not idle time
        self.wait_s = 0.0
        self.publish_s: list[float] = []
        self.publish_bytes = 0
        self.created_upto = self._start_attempt()

    # ----- BatchSource -----------------------------------------------------------------------

    def publish(self, version: int, policy: torch.nn.Module) -> None:
        started = time.perf_counter()
        if self.started is None:
            self.started = started
        if self.mode == "async":
            # Published while a step is left to train (jobs take the newest weights when claimed);
            # jobs only for the steps this version made admissible, so O(1) a step for any bound.
            if version + 1 > self.config.steps:
                return
            admissible = min(self.config.steps, version + 1 + self.config.execution.max_staleness)
            steps = range(max(version + 1, self.created_upto + 1), admissible + 1)
        else:
            steps = [t for t in self._steps_of.get(version, ()) if t > version]
            if not steps:
                return
        self._record_version(version, self._publish_weights(version, policy), steps)
        self.created_upto = max([self.created_upto, *steps])
        self.wait_s += time.perf_counter() - started

    def evaluate(self, step: int, learner: Learner) -> None:
        """Publish version `step` and create its eval jobs; the result comes back through
        `evaluations`."""
        started = time.perf_counter()
        self._record_version(step, self._publish_weights(step, learner.policy), (), evaluate=True)
        self.wait_s += time.perf_counter() - started

    def evaluations(self, wait: bool) -> list[tuple[int, dict[str, float]]]:
        """The evaluations whose eval jobs are all done and that this attempt has not handed out
        yet, by step; `wait`: until every eval job of the run is done (a job given up raises)."""
        done: list[tuple[int, dict[str, float]]] = []

        def check() -> tuple[bool, RolloutJob | None]:
            ready, pending, given_up = self._eval_results()
            done.extend(ready)
            self.evals_logged.update(step for step, _ in ready)
            return not pending, given_up

        if wait:
            started = time.perf_counter()
            self._wait_for(check, "the evaluations")
            self.wait_s += time.perf_counter() - started
        else:
            check()
        return done

    def take(self, step: int) -> Batch:
        started = time.perf_counter()
        jobs: list[RolloutJob] = []

        def check() -> tuple[bool, RolloutJob | None]:
            jobs[:] = self._jobs_of(step)
            if len(jobs) < len(self.slices):
                self._ensure_jobs(step)
                return False, None
            given_up = next((j for j in jobs if j.status in GIVEN_UP), None)
            return given_up is None and all(j.status == RolloutJob.DONE for j in jobs), given_up

        self._wait_for(check, f"step {step}'s batch")
        parts = [Batch.load(Path(j.path), j.sha256) for j in jobs]
        batch = parts[0] if len(parts) == 1 else Batch.concat(parts)
        self.last_taken = step
        self.wait_s += time.perf_counter() - started
        self._prune_weights()
        return batch

    def state(self) -> dict[str, Any]:
        """Nothing but the step: the buffer itself is durable. Batch files of steps before the
        previous checkpoint can go now (no resume goes back that far)."""
        self._prune_batches(upto=self.checkpointed)
        self.checkpointed = self.last_taken
        return {"checkpoint_step": self.last_taken}

    def load_state(self, state: dict[str, Any]) -> None:
        self.checkpointed = self.last_taken = state["checkpoint_step"]

    # ----- what the worker reports once the run is over ------------------------------------

    @retry_db
    def summary(self) -> dict[str, float]:
        """Weight publish time and bytes, and how idle the trainer and the rollout workers were."""
        wall = time.perf_counter() - self.started if self.started is not None else 0.0
        jobs = RolloutJob.objects.filter(run=self.run, status=RolloutJob.DONE)
        busy = sum((j.duration_s or 0.0) for j in jobs)
        rollout_workers = max(1, jobs.values("worker").distinct().count())
        return {
            "weights/publish_s_mean": sum(self.publish_s) / len(self.publish_s) if self.publish_s else 0.0,
            "weights/publish_bytes": float(self.publish_bytes),
            "idle/trainer_frac": min(1.0, self.wait_s / wall) if wall > 0 else 0.0,
            "idle/rollout_frac": max(0.0, 1.0 - busy / (rollout_workers * wall)) if wall > 0 else 0.0,
        }

    # ----- internals ----------------------------------------------------------------------------

    def _wait_for(self, check: Callable[[], tuple[bool, RolloutJob | None]], what: str) -> None:
        """Call `check()` until it says done, pausing a little longer each time (a short pause
        here is a step's idle time). Raises `Stopped` once the run is asked to stop, and
        RuntimeError for a job `check` names as given up (failed, lost or cancelled)."""
        pause, next_stop_check = POLL_S, time.perf_counter() + STOP_CHECK_S
        while True:
            done, given_up = check()
            if done:
                return
            now = time.perf_counter()
            if given_up is not None or now >= next_stop_check:
                if self.should_stop():
                    raise Stopped(f"stopped while waiting for {what}")
                next_stop_check = now + STOP_CHECK_S
            if given_up is not None:
                raise RuntimeError(f"{given_up} {given_up.status}: {given_up.error}")
            time.sleep(pause)
            pause = min(MAX_POLL_S, pause * 1.5)

    def _publish_weights(self, version: int, policy: torch.nn.Module) -> Published:
        """Write `version`'s weights once (an evaluation and the next step both publish it)."""
        if self._published is None or self._published[0] != version:
            published = self.store.publish(version, policy.state_dict())
            self.publish_s.append(published.seconds)
            self.publish_bytes += published.size_bytes
            self._published = (version, published)
        return self._published[1]

    @retry_db
    def _eval_results(self) -> tuple[list[tuple[int, dict[str, float]]], set[int], RolloutJob | None]:
        """(evaluations done and not handed out yet, steps still pending, an eval job given up)."""
        jobs = RolloutJob.objects.filter(run=self.run, kind=RolloutJob.EVAL).exclude(
            step__in=self.evals_logged
        )
        by_step: dict[int, list[RolloutJob]] = {}
        for job in jobs:
            by_step.setdefault(job.step, []).append(job)
        ready, pending = [], set()
        for step, parts in sorted(by_step.items()):
            if all(j.status == RolloutJob.DONE for j in parts):
                ready.append((step, sum((EvalSums(**j.result) for j in parts), EvalSums()).metrics()))
            else:
                pending.add(step)
        given_up = next((j for parts in by_step.values() for j in parts if j.status in GIVEN_UP), None)
        return ready, pending, given_up

    @retry_db
    def _start_attempt(self) -> int:
        """Give every unfinished step's jobs of earlier attempts a fresh chance; return the last
        step whose jobs exist (async creates each step's jobs once, as soon as they are admissible)."""
        for job in RolloutJob.objects.filter(
            run=self.run, status__in=(RolloutJob.CANCELLED, RolloutJob.FAILED, RolloutJob.LOST)
        ):
            job.requeue(Q(status=job.status, attempt=job.attempt), "re-queued by a new trainer attempt")
        batches = RolloutJob.objects.filter(run=self.run, kind=RolloutJob.BATCH)
        return batches.aggregate(t=Max("step"))["t"] or 0

    @retry_db
    def _record_version(
        self, version: int, published: Published, steps: Iterable[int], evaluate: bool = False
    ) -> None:
        """Record published `version` and create the batch jobs of `steps` and, if `evaluate`,
        the eval jobs of `version` (sent once committed)."""
        with transaction.atomic():
            row, created = PolicyVersion.objects.get_or_create(
                run=self.run,
                version=version,
                defaults={
                    "sha256": published.sha256,
                    "size_bytes": published.size_bytes,
                    "publish_s": published.seconds,
                },
            )
            if not created and row.sha256 != published.sha256:
                # A resumed trainer republished other bytes (e.g. on another machine): what the
                # old bytes generated and nobody has trained yet is made again, and evaluated.
                PolicyVersion.objects.filter(pk=row.pk).update(sha256=published.sha256)
                redo = Q(kind=RolloutJob.EVAL)
                if self.mode == "distributed":
                    redo |= Q(kind=RolloutJob.BATCH, step__gt=version)
                for job in RolloutJob.objects.filter(redo, run=self.run, version=version):
                    job.requeue(Q(attempt=job.attempt), "weights republished with other bytes")
                self.evals_logged.discard(version)  # its evaluation is logged again once re-made
            for step in steps:
                self._create_jobs(step, version)
            if evaluate:
                self._create_eval_jobs(version)

    @retry_db
    def _jobs_of(self, step: int) -> list[RolloutJob]:
        return list(
            RolloutJob.objects.filter(run=self.run, kind=RolloutJob.BATCH, step=step).order_by("part")
        )

    def _create_jobs(self, step: int, version: int) -> None:
        """The batch jobs of `step` (async: the version is chosen at claim), sent once created."""
        self._create(RolloutJob.BATCH, step, self.slices, version if self.mode == "distributed" else None)

    def _create_eval_jobs(self, version: int) -> None:
        """The eval jobs of `version`, at step `version`: held-out problems in parts."""
        self._create(RolloutJob.EVAL, version, self.eval_slices, version)

    def _create(self, kind: str, step: int, parts: list[range], version: int | None) -> None:
        for part, rows in enumerate(parts):
            job, created = RolloutJob.objects.get_or_create(
                run=self.run,
                kind=kind,
                step=step,
                part=part,
                defaults={
                    "groups_start": rows.start,
                    "groups_stop": rows.stop,
                    "version": version,
                    "queue": self.config.rollout_queue,
                },
            )
            if created:
                job.enqueue()

    @retry_db
    def _ensure_jobs(self, step: int) -> None:
        """A step whose jobs were never created (a trainer that died between publishing and
        creating them): create them from the weights already published."""
        newest = newest_version(self.run)
        if self.mode == "distributed":
            s = self.config.staleness
            needed = behavior_version(step, s.sync_interval, s.sync_offset, s.offline)
            if not PolicyVersion.objects.filter(run=self.run, version=needed).exists():
                raise RuntimeError(f"step {step} needs policy version {needed}, which was never published")
            version = needed
        else:
            if newest is None:
                raise RuntimeError(f"step {step}: no policy version was published yet")
            version = newest.version
        with transaction.atomic():
            self._create_jobs(step, version)

    @retry_db
    def _prune_weights(self) -> None:
        """Keep the newest version and every version an unfinished job still needs."""
        needed = set(
            RolloutJob.objects.filter(run=self.run, status__in=RolloutJob.UNFINISHED)
            .exclude(version=None)
            .values_list("version", flat=True)
        )
        newest = PolicyVersion.objects.filter(run=self.run).aggregate(v=Max("version"))["v"]
        if newest is not None:
            needed.add(newest)
        self.store.prune(needed)

    @retry_db
    def _prune_batches(self, upto: int) -> None:
        for job in RolloutJob.objects.filter(run=self.run, step__lte=upto).exclude(path=""):
            Path(job.path).unlink(missing_ok=True)
