"""`DatabaseSource`: a trainer's batches made by rollout jobs on other workers (rows in the
database), on the schedule or the admission bound of its execution mode (`workers.admission`);
its held-out evaluations made as eval jobs, partly by the trainer itself while it waits. What
fails its check is made again, not trusted (docs/architecture.md, "How a step's data flows")."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from django.db import IntegrityError, transaction
from django.db.models import Max, Q

from experiments.models import PolicyVersion, RolloutJob, Run
from rlcore.batch import Batch
from rlcore.config import RunConfig
from rlcore.evaluate import EvalSums, Evaluator
from rlcore.sinks import Measured, Stopped
from rlcore.weights import Published
from workers import buffer, jobs
from workers.admission import ADMISSION, group_slices
from workers.db_outage import retry_db
from workers.sink import NotOwner

log = logging.getLogger(__name__)

# How often a waiting trainer looks for its batch: a short wait here is a step's idle time.
POLL_S = 0.001
MAX_POLL_S = 0.02
STOP_CHECK_S = 0.5
EVALS_CHECK_S = 0.25  # how often a trainer between steps looks for finished evaluations
GIVEN_UP = (RolloutJob.FAILED, RolloutJob.LOST, RolloutJob.CANCELLED)


class BufferDamaged(RuntimeError):
    """A batch or an evaluation the trainer waits for cannot be made: the weights it needs are
    missing or damaged and this attempt has moved past that version. The worker re-queues the run,
    which resumes from an earlier checkpoint and publishes the version again."""


@dataclass(frozen=True)
class Existing:
    """The newest rows of a run when a trainer attempt starts: anything newer is its own to write."""

    version: int  # -1: none
    batch_step: int  # 0: none
    eval_step: int  # -1: none


class DatabaseSource:
    """A `BatchSource` whose batches are made by rollout jobs (rows in the database)."""

    def __init__(self, run: Run, config: RunConfig, should_stop: Callable[[], bool], worker: str = "trainer"):
        self.run = run
        self.worker = worker  # the training worker: the name on the eval parts it makes
        self.config = config
        self.admission = ADMISSION[config.execution.mode](config)
        self.should_stop = should_stop
        self.publisher = buffer.Publisher(run)
        self.evals = jobs.TrainerEvalParts(run.pk, worker, copies=self.admission.evaluates_between_batches)
        self.slices = group_slices(config.rollout.prompts_per_step, config.execution.rollout_workers)
        self.eval_slices = self.admission.eval_slices()
        self.evals_logged: set[int] = set()  # a new attempt logs every done evaluation again
        self.evals_pending: set[int] | None = None  # evaluations out (None: not looked yet)
        self.evals_checked = 0.0  # when they were last looked for (time.monotonic())
        self.last_taken = 0
        self.checkpointed = 0  # the step of the last checkpoint whose state() we gave
        self.started: float | None = None  # the first publish: loading θ0 is not idle time
        self.idle_s = 0.0  # blocked in `_wait_for`, less the eval parts made there
        self._recorded: set[int] = set()  # versions this attempt recorded
        self._before = self._existing()
        self.created_upto = self._before.batch_step

    # ----- BatchSource -----------------------------------------------------------------------

    def publish(self, version: int, policy: torch.nn.Module) -> None:
        if self.started is None:
            self.started = time.perf_counter()
        self.evals.policy_version = version
        steps = self.admission.steps_to_create(version, self.created_upto)
        if steps is None:
            return
        self._check_owner()  # a stalled trainer that lost the run writes no weights over its owner's
        self._record_version(version, self.publisher.publish(version, policy), steps)
        self.created_upto = max([self.created_upto, *steps])

    def evaluate(self, step: int, policy: torch.nn.Module, evaluator: Evaluator) -> None:
        """Publish version `step` and create its eval jobs; the result comes back through
        `evaluations`."""
        if self.started is None:
            self.started = time.perf_counter()
        # The previous evaluation's parts the rollout workers have not taken yet are made here
        # first: they fell behind (batches come first), and a backlog would grow to the run's end.
        while self.evals.make_one():
            pass
        self.evals.newest(step, policy, evaluator)
        self._check_owner()
        self._record_version(step, self.publisher.publish(step, policy), (), evaluate=True)
        if self.evals_pending is not None:
            self.evals_pending.add(step)

    def evaluations(self, wait: bool) -> list[tuple[int, dict[str, float]]]:
        """The evaluations whose eval jobs are all done and that this attempt has not handed out
        yet, by step; `wait`: until every eval job of the run is done (a job given up raises)."""
        done: list[tuple[int, dict[str, float]]] = []

        def check() -> tuple[bool, RolloutJob | None]:
            ready, pending, given_up = self._eval_results()
            done.extend(ready)
            self.evals_logged.update(step for step, _ in ready)
            self.evals_pending, self.evals_checked = pending, time.monotonic()
            return not pending, given_up

        if wait:
            self._wait_for(check, "the evaluations", evaluate_meanwhile=lambda: True)
        elif self.evals_pending is None or (
            self.evals_pending and time.monotonic() - self.evals_checked >= EVALS_CHECK_S
        ):
            check()  # a query every step would cost the trainer more than its answer is worth
        return done

    def take(self, step: int) -> Batch:
        parts_of_step: list[RolloutJob] = []

        def check() -> tuple[bool, RolloutJob | None]:
            parts_of_step[:] = self._jobs_of(step)
            if len(parts_of_step) < len(self.slices):
                self._ensure_jobs(step)
                return False, None
            given_up = next((j for j in parts_of_step if j.status in GIVEN_UP), None)
            return given_up is None and all(j.status == RolloutJob.DONE for j in parts_of_step), given_up

        def unclaimed() -> bool:
            """A part of the batch no rollout worker has taken yet: they are busy elsewhere, so an
            eval part made here meanwhile costs the step nothing it would not wait anyway."""
            return any(j.status == RolloutJob.QUEUED for j in parts_of_step)

        meanwhile = unclaimed if self.admission.evaluates_between_batches else None
        while True:
            self._wait_for(check, f"step {step}'s batch", evaluate_meanwhile=meanwhile)
            parts, bad = [], []
            for job in parts_of_step:
                try:
                    parts.append(Batch.load(Path(job.path), job.sha256))
                except (OSError, ValueError) as exc:  # missing, or not the bytes recorded
                    bad.append((job, exc))
            if not bad:
                break
            # A batch is a pure function of config, step and weights: made again, then taken.
            for job, exc in bad:
                log.warning(
                    "run %s: %s: its batch file cannot be used (%s); made again", self.run.pk, job, exc
                )
                self._remake(job, f"its batch file could not be used when the trainer took it ({exc})")
        batch = parts[0] if len(parts) == 1 else Batch.concat(parts)
        self.last_taken = step
        self.evals.policy_version = None  # the step's update comes next
        self._prune_weights()
        return batch

    def state(self) -> dict[str, Any]:
        """Nothing but the step: the buffer itself is durable. Batch files of steps before the
        previous checkpoint can go now (no resume goes back that far)."""
        retry_db(buffer.remove_batches)(self.run, upto=self.checkpointed)
        self.checkpointed = self.last_taken
        return {"checkpoint_step": self.last_taken}

    def load_state(self, state: dict[str, Any]) -> None:
        self.checkpointed = self.last_taken = state["checkpoint_step"]

    @retry_db
    def resume_problem(self, step: int) -> str:
        """Why this attempt cannot go on from the checkpoint of `step` ("" if it can): a batch or
        an evaluation that a later step needs is not made, and its policy version is older than
        `step` (the trainer publishes only versions from `step` on) and its weights file is missing
        or damaged. A resume from an earlier checkpoint publishes that version again."""
        checked: dict[int, str] = {}

        def weights(version: int) -> str:
            if version not in checked:
                checked[version] = buffer.weights_problem(self.run, version)
            return checked[version]

        unfinished_evals = RolloutJob.objects.filter(
            run=self.run, kind=RolloutJob.EVAL, version__lt=step
        ).exclude(status=RolloutJob.DONE)
        for job in unfinished_evals:
            if problem := weights(job.version):
                return f"the evaluation of step {job.step} is not made and {problem}"
        if not self.admission.fixed_versions:
            return ""  # batch jobs take the newest weights, which the trainer publishes at once
        for t in range(step + 1, self.config.steps + 1):
            version = self.admission.version_of(t)
            if version >= step:
                continue
            made = self._jobs_of(t)
            if len(made) == len(self.slices) and all(buffer.batch_file_intact(j) for j in made):
                continue
            if problem := weights(version):
                return f"step {t}'s batch is not made and {problem}"
        return ""

    @retry_db
    def resume(self, step: int) -> None:
        """Give the jobs earlier attempts gave up (failed, lost, cancelled) a fresh chance, except
        those whose weights are missing or damaged: this attempt publishes them again (from `step`
        on), and they are re-queued then (`_record`).

        Async: the versions after `step` an earlier attempt published are a future this run never
        reached, so they go (`_forget_after`) before a batch job can read one as the newest."""
        if not self.admission.fixed_versions:
            self._forget_after(step)
        for job in RolloutJob.objects.filter(run=self.run, status__in=GIVEN_UP):
            if (
                job.version is not None
                and job.version >= step
                and buffer.weights_problem(self.run, job.version)
            ):
                continue
            self._remake(job, "re-queued by a new trainer attempt")

    def _forget_after(self, step: int) -> None:
        """Async resume from `step`: drop the policy versions after `step` and their evaluations,
        and make again the batches of later steps that may have been made with them (done with
        such a version, or being made: an async job's version is known only once it is done).
        Rows first, so a job claimed from now on reads `step`'s version or older."""
        with transaction.atomic():
            PolicyVersion.objects.filter(run=self.run, version__gt=step).delete()
            RolloutJob.objects.filter(run=self.run, kind=RolloutJob.EVAL, version__gt=step).delete()
        later = RolloutJob.objects.filter(run=self.run, kind=RolloutJob.BATCH, step__gt=step)
        for job in later.filter(Q(status=RolloutJob.RUNNING) | Q(status=RolloutJob.DONE, version__gt=step)):
            self._remake(
                job, "made with a policy version of an earlier attempt that the resume went back past"
            )

    # ----- what the worker reports once the run is over ------------------------------------

    @retry_db
    def summary(self) -> dict[str, float]:
        """Weight publish time and bytes, how many eval parts the trainer made, and how idle the
        trainer and the rollout workers were since the trainer's first publish: the trainer while
        blocked on a batch or an evaluation that was not ready (`_wait_for`; not publishing, not
        reading batches, not making eval parts), the rollout workers while in no job."""
        wall = time.perf_counter() - self.started if self.started is not None else 0.0
        done = RolloutJob.objects.filter(run=self.run, status=RolloutJob.DONE).exclude(worker=self.worker)
        busy = sum((j.duration_s or 0.0) for j in done)
        rollout_workers = max(1, done.values("worker").distinct().count())
        seconds = self.publisher.seconds
        return Measured(
            weights_publish_s_mean=sum(seconds) / len(seconds) if seconds else 0.0,
            weights_publish_bytes=float(self.publisher.size_bytes),
            evals_trainer_parts=float(self.evals.made),
            idle_trainer_frac=min(1.0, self.idle_s / wall) if wall > 0 else 0.0,
            idle_rollout_frac=max(0.0, 1.0 - busy / (rollout_workers * wall)) if wall > 0 else 0.0,
        ).stored()

    # ----- internals ----------------------------------------------------------------------------

    def _wait_for(
        self,
        check: Callable[[], tuple[bool, RolloutJob | None]],
        what: str,
        evaluate_meanwhile: Callable[[], bool] | None = None,
    ) -> None:
        """Call `check()` until it says done, pausing a little longer each time (a short pause
        here is a step's idle time), or, while `evaluate_meanwhile()` says so, making a queued
        eval part instead where there is one (`TrainerEvalParts.make_one`). Raises `Stopped` once the run is
        asked to stop, and RuntimeError for a job `check` names as given up (failed, lost or
        cancelled).

        The trainer is idle (`idle_s`) from the first `check()` that finds it not done until it
        returns or raises, less the eval parts it made meanwhile: what was ready at once costs no
        idle time, and neither publishing nor reading a batch is waiting."""
        pause, next_stop_check = POLL_S, time.perf_counter() + STOP_CHECK_S
        waiting_since: float | None = None
        parts_before = self.evals.seconds
        try:
            while True:
                done, given_up = check()
                if done:
                    return
                if waiting_since is None:
                    waiting_since = time.perf_counter()
                if evaluate_meanwhile and given_up is None and evaluate_meanwhile() and self.evals.make_one():
                    pause = POLL_S
                    continue
                now = time.perf_counter()
                if given_up is not None or now >= next_stop_check:
                    if self.should_stop():
                        raise Stopped(f"stopped while waiting for {what}")
                    next_stop_check = now + STOP_CHECK_S
                if given_up is not None:
                    raise self._given_up(given_up)
                time.sleep(pause)
                pause = min(MAX_POLL_S, pause * 1.5)
        finally:
            if waiting_since is not None:
                waited = time.perf_counter() - waiting_since
                self.idle_s += max(0.0, waited - (self.evals.seconds - parts_before))

    @retry_db
    def _eval_results(self) -> tuple[list[tuple[int, dict[str, float]]], set[int], RolloutJob | None]:
        """(evaluations done and not handed out yet, steps still pending, an eval job given up)."""
        parts_out = RolloutJob.objects.filter(run=self.run, kind=RolloutJob.EVAL).exclude(
            step__in=self.evals_logged
        )
        by_step: dict[int, list[RolloutJob]] = {}
        for job in parts_out:
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
    def _existing(self) -> Existing:
        """The newest rows that exist as this attempt starts (async creates each step's jobs once,
        as soon as they are admissible)."""
        newest = RolloutJob.objects.filter(run=self.run).aggregate(
            batch=Max("step", filter=Q(kind=RolloutJob.BATCH)),
            eval=Max("step", filter=Q(kind=RolloutJob.EVAL)),
        )
        version = PolicyVersion.objects.filter(run=self.run).aggregate(v=Max("version"))["v"]
        return Existing(
            version=-1 if version is None else version,
            batch_step=newest["batch"] or 0,
            eval_step=-1 if newest["eval"] is None else newest["eval"],
        )

    def _remake(self, job: RolloutJob, error: str) -> bool:
        """Queue `job` again as a new attempt (async batch jobs take the newest weights anew)."""
        newest = not self.admission.fixed_versions and job.kind == RolloutJob.BATCH
        changes = {"version": None} if newest else {}
        return job.requeue(Q(status=job.status, attempt=job.attempt), error, **changes)

    def _given_up(self, job: RolloutJob) -> Exception:
        """What to raise for a job the trainer waits on that was given up: `BufferDamaged` when its
        weights cannot be loaded (this attempt cannot publish that version again: the run goes on
        from an earlier checkpoint), else a RuntimeError with the job's own error."""
        published = (
            job.version is not None
            and retry_db(PolicyVersion.objects.filter(run=self.run, version=job.version).exists)()
        )
        if published and (problem := retry_db(buffer.weights_problem)(self.run, job.version)):
            return BufferDamaged(
                f"{job} cannot be made: {problem}; the run resumes from a checkpoint before policy version "
                f"{job.version} (or from the start) and publishes it again"
            )
        return RuntimeError(f"{job} {job.status}: {job.error}")

    @retry_db
    def _check_owner(self) -> None:
        if not Run.objects.filter(pk=self.run.pk, status=Run.RUNNING, worker=self.worker).exists():
            raise NotOwner(f"run {self.run.pk} is no longer executed by {self.worker}: it publishes nothing")

    @retry_db
    def _record_version(
        self, version: int, published: Published, steps: Iterable[int], evaluate: bool = False
    ) -> None:
        """Record published `version` and create the batch jobs of `steps` and, if `evaluate`,
        the eval jobs of `version` (sent once committed).

        Rows newer than any that existed when this attempt started are simply inserted (what a
        trainer writes every step: one INSERT a row, no read first); should another attempt of
        this run have written one meanwhile, the transaction is made again the careful way."""
        try:
            with transaction.atomic():
                self._record(version, published, steps, evaluate, fresh=True)
        except IntegrityError:
            with transaction.atomic():
                self._record(version, published, steps, evaluate, fresh=False)
        self._recorded.add(version)

    def _record(
        self, version: int, published: Published, steps: Iterable[int], evaluate: bool, fresh: bool
    ) -> None:
        if not self.run.hold(self.worker):
            raise NotOwner(
                f"run {self.run.pk} is no longer executed by {self.worker}: version {version} not recorded"
            )
        fields = {
            "sha256": published.sha256,
            "size_bytes": published.size_bytes,
            "publish_s": published.seconds,
        }
        if version in self._recorded:
            pass  # by this attempt, with these bytes (a version is written once an attempt)
        elif fresh and version > self._before.version:
            PolicyVersion.objects.create(run=self.run, version=version, **fields)
        else:
            row, created = PolicyVersion.objects.get_or_create(run=self.run, version=version, defaults=fields)
            if not created and row.sha256 != published.sha256:
                # A resumed trainer republished other bytes (e.g. on another machine): what the
                # old bytes generated and nobody has trained yet is made again, and evaluated.
                PolicyVersion.objects.filter(pk=row.pk).update(sha256=published.sha256)
                redo = Q(kind=RolloutJob.EVAL)
                if self.admission.fixed_versions:
                    redo |= Q(kind=RolloutJob.BATCH, step__gt=version)
                for job in RolloutJob.objects.filter(redo, run=self.run, version=version):
                    job.requeue(Q(attempt=job.attempt), "weights republished with other bytes")
                self.evals_logged.discard(version)  # its evaluation is logged again once re-made
            # Jobs given up on this version's weights (missing or damaged) can be made now.
            for job in RolloutJob.objects.filter(run=self.run, version=version, status__in=GIVEN_UP):
                job.requeue(Q(status=job.status, attempt=job.attempt), "its weights were published again")
        for step in steps:
            self._create_jobs(step, fresh=fresh and step > self._before.batch_step)
        if evaluate:
            self._create_eval_jobs(version, fresh=fresh and version > self._before.eval_step)

    @retry_db
    def _jobs_of(self, step: int) -> list[RolloutJob]:
        return list(
            RolloutJob.objects.filter(run=self.run, kind=RolloutJob.BATCH, step=step).order_by("part")
        )

    def _create_jobs(self, step: int, fresh: bool = False) -> None:
        """The batch jobs of `step` with their version (or none: chosen at claim), sent once created."""
        self._create(RolloutJob.BATCH, step, self.slices, self.admission.version_of(step), fresh)

    def _create_eval_jobs(self, version: int, fresh: bool = False) -> None:
        """The eval jobs of `version`, at step `version`: held-out problems in parts."""
        self._create(RolloutJob.EVAL, version, self.eval_slices, version, fresh)

    def _create(self, kind: str, step: int, parts: list[range], version: int | None, fresh: bool) -> None:
        """The jobs of `step`'s `parts`, sent once created; `fresh`: none of them can exist yet
        (an INSERT each; one that did exist fails the transaction with IntegrityError)."""
        for part, rows in enumerate(parts):
            fields = {
                "groups_start": rows.start,
                "groups_stop": rows.stop,
                "version": version,
                "queue": self.config.rollout_queue,
            }
            key = {"run": self.run, "kind": kind, "step": step, "part": part}
            if fresh:
                job, created = RolloutJob.objects.create(**key, **fields), True
            else:
                job, created = RolloutJob.objects.get_or_create(**key, defaults=fields)
            if created:
                job.enqueue()

    @retry_db
    def _ensure_jobs(self, step: int) -> None:
        """A step whose jobs were never created (a trainer that died between publishing and
        creating them): create them from the weights already published."""
        needed = self.admission.version_of(step)
        if needed is None and buffer.newest_version(self.run) is None:
            raise RuntimeError(f"step {step}: no policy version was published yet")
        if needed is not None and not PolicyVersion.objects.filter(run=self.run, version=needed).exists():
            raise RuntimeError(f"step {step} needs policy version {needed}, which was never published")
        with transaction.atomic():
            self._create_jobs(step)

    @retry_db
    def _prune_weights(self) -> None:
        """Prune the published weights no job needs (`buffer.Publisher.prune`), keeping, with fixed
        versions, those of the batches not taken yet, in case one must be made again."""
        untaken = (
            {
                self.admission.version_of(t)
                for t in range(self.last_taken + 1, min(self.config.steps, self.created_upto) + 1)
            }
            if self.admission.fixed_versions
            else set()
        )
        self.publisher.prune(untaken)
