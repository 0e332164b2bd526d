"""The work a run's trainer hands out and what it writes: rollout jobs (batch and eval parts, each
leased like a run), the policy versions it published and the checkpoints it wrote."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import models, transaction
from django.db.models import F, Q
from django.utils import timezone

from execution.leases import Leased
from experiments.text import public_error


class RolloutJob(Leased):
    """Work a rollout worker does for a run's trainer, of one of two kinds:
    - `batch`: generate part `part` of trainer step `step`'s batch (prompt groups
      [groups_start, groups_stop)) with policy version `version`;
    - `eval`: evaluate policy version `version` (= `step`, the policy after that step's update)
      on held-out problems [groups_start, groups_stop); the sums go to `result` and the trainer
      logs the evaluation at `step` once every part is done.

    The same lease idiom as `Run`: a conditional UPDATE claims an attempt, the worker beats a
    heartbeat while it generates, the reaper re-queues a job whose worker vanished, and a late
    message or a late finish of an older attempt changes nothing. In async execution `version`
    is chosen by each attempt once claimed, when it loads the newest published weights, and
    written when it finishes: the version that generated the batch.
    """

    QUEUED, RUNNING, DONE, FAILED, CANCELLED, LOST = (
        "queued",
        "running",
        "done",
        "failed",
        "cancelled",
        "lost",
    )
    STATUSES = [(s, s) for s in (QUEUED, RUNNING, DONE, FAILED, CANCELLED, LOST)]
    UNFINISHED = (QUEUED, RUNNING)
    BATCH, EVAL = "batch", "eval"
    TASK = "workers.tasks.generate_batch"

    run = models.ForeignKey("experiments.Run", on_delete=models.CASCADE, related_name="rollout_jobs")
    kind = models.CharField(max_length=10, choices=[(BATCH, BATCH), (EVAL, EVAL)], default=BATCH)
    step = models.IntegerField()
    part = models.IntegerField(default=0)
    groups_start = models.IntegerField()
    groups_stop = models.IntegerField()
    version = models.IntegerField(null=True, blank=True, help_text="policy version; async: set at claim")
    queue = models.CharField(max_length=20, default="rollout")
    status = models.CharField(max_length=20, choices=STATUSES, default=QUEUED, db_index=True)
    losses = models.PositiveIntegerField(
        default=0, help_text="attempts lost with their worker (not the job's own failures)"
    )
    path = models.CharField(max_length=500, blank=True, help_text="the batch file, once done")
    sha256 = models.CharField(max_length=64, blank=True)
    result = models.JSONField(null=True, blank=True, help_text="eval jobs: the evaluation's sums, once done")
    cpu_s = models.FloatField(
        null=True, blank=True, help_text="CPU seconds of the worker's process making it"
    )
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "step", "kind", "part"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "kind", "step", "part"], name="one_job_per_run_kind_step_part"
            )
        ]

    def __str__(self) -> str:
        return f"rollout job {self.pk} (run {self.run_id}, {self.kind} of step {self.step}, part {self.part})"

    @property
    def duration_s(self) -> float | None:
        if self.started is None or self.finished is None:
            return None
        return (self.finished - self.started).total_seconds()

    def beat(self, worker: str, attempt: int) -> bool:
        return (
            RolloutJob.objects.filter(
                pk=self.pk, status=RolloutJob.RUNNING, worker=worker, attempt=attempt
            ).update(heartbeat=timezone.now())
            == 1
        )

    def finish(
        self,
        worker: str,
        attempt: int,
        version: int,
        path: str = "",
        sha256: str = "",
        result: dict | None = None,
        cpu_s: float | None = None,
    ) -> bool:
        return self._update(
            Q(status=RolloutJob.RUNNING, worker=worker, attempt=attempt),
            reload=False,  # the worker is done with the job
            status=RolloutJob.DONE,
            version=version,
            path=path,
            sha256=sha256,
            result=result,
            cpu_s=cpu_s,
            finished=timezone.now(),
        )

    @classmethod
    def cpu_rows(cls, run: models.Model, since: datetime, trainer: str) -> list[tuple[str, float, datetime]]:
        """(worker, CPU seconds, finished) of the run's rollout jobs made since `since` by rollout
        workers (not by its `trainer` itself, whose own CPU time counts them)."""
        rows = cls.objects.filter(run=run, status=cls.DONE, finished__gte=since, cpu_s__isnull=False)
        return list(rows.exclude(worker=trainer).values_list("worker", "cpu_s", "finished"))

    @property
    def failures(self) -> int:
        """Attempts that ended in the job's own failure, this one included while it runs."""
        return self.attempt - self.losses

    def fail(self, worker: str, attempt: int, error: str, final: bool = False) -> bool:
        """running → queued as a new attempt while its failures leave attempts (LAB_MAX_ATTEMPTS;
        attempts lost with a worker do not count), else, or if `final` (another attempt would
        fail the same way), → failed."""
        error = public_error(error)
        with transaction.atomic():
            if (
                not final
                and self.failures < settings.LAB_MAX_ATTEMPTS
                and self._update(
                    Q(status=RolloutJob.RUNNING, worker=worker, attempt=attempt),
                    status=RolloutJob.QUEUED,
                    attempt=F("attempt") + 1,
                    worker="",
                    error=error,
                    dispatched_at=timezone.now(),
                )
            ):
                self.enqueue()
                return True
            return self._update(
                Q(status=RolloutJob.RUNNING, worker=worker, attempt=attempt),
                status=RolloutJob.FAILED,
                finished=timezone.now(),
                error=error,
            )

    def requeue(self, condition: Q, error: str = "", lost: bool = False, **changes) -> bool:
        """→ queued as a new attempt if the row still matches `condition`; `lost`: the attempt
        ended with its worker (counted in `losses`, not as a failure)."""
        with transaction.atomic():
            done = self._update(
                condition,
                status=RolloutJob.QUEUED,
                attempt=F("attempt") + 1,
                losses=F("losses") + int(lost),
                worker="",
                finished=None,
                path="",
                sha256="",
                result=None,
                error=public_error(error),
                dispatched_at=timezone.now(),
                **changes,
            )
            if done:
                self.enqueue()
        return done

    @classmethod
    def cancel_for(cls, run: models.Model) -> int:
        return cls.objects.filter(run=run, status__in=cls.UNFINISHED).update(
            status=cls.CANCELLED, finished=timezone.now()
        )

    @classmethod
    def reap(cls) -> list[RolloutJob]:
        """Re-queue jobs whose worker stopped heartbeating: a worker's death is not the job's
        failure, so it counts against `LAB_MAX_JOB_LOSSES`, not LAB_MAX_ATTEMPTS; past that, the
        job is `lost`."""
        stale_before = timezone.now() - timedelta(seconds=settings.LAB_HEARTBEAT_TIMEOUT_S)
        reaped = []
        for job in cls.objects.filter(status=cls.RUNNING, heartbeat__lt=stale_before):
            stale = Q(status=cls.RUNNING, heartbeat__lt=stale_before, attempt=job.attempt)
            error = f"worker {job.worker} stopped sending heartbeats"
            if job.losses + 1 < settings.LAB_MAX_JOB_LOSSES:
                changed = job.requeue(stale, error, lost=True)
            else:
                error += f" ({job.losses + 1} workers lost in this job; LAB_MAX_JOB_LOSSES)"
                changed = job._update(stale, status=cls.LOST, finished=timezone.now(), error=error)
            if changed:
                reaped.append(job)
        return reaped


class PolicyVersion(models.Model):
    """Policy weights a trainer published for rollout workers (a file in the run's buffer)."""

    run = models.ForeignKey("experiments.Run", on_delete=models.CASCADE, related_name="policy_versions")
    version = models.IntegerField()
    sha256 = models.CharField(max_length=64)
    size_bytes = models.BigIntegerField()
    publish_s = models.FloatField(help_text="seconds to serialise and write the file")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "version"]
        constraints = [models.UniqueConstraint(fields=["run", "version"], name="one_row_per_run_version")]

    def __str__(self) -> str:
        return f"run {self.run_id} version {self.version}"


class Checkpoint(models.Model):
    """A trainer checkpoint of a run, as written: its sha256 is checked before the checkpoint is
    restored, so a file altered in the shared `LAB_VAR_DIR` is never resumed from."""

    run = models.ForeignKey("experiments.Run", on_delete=models.CASCADE, related_name="checkpoints")
    step = models.IntegerField()
    sha256 = models.CharField(max_length=64)
    size_bytes = models.BigIntegerField()
    created = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["run", "step"]
        constraints = [models.UniqueConstraint(fields=["run", "step"], name="one_checkpoint_per_run_step")]

    def __str__(self) -> str:
        return f"run {self.run_id} checkpoint of step {self.step}"
