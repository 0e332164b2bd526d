"""The worker registry: each worker process's own heartbeat, which tells a queue nobody listens on
from one whose workers are busy, the rollout precisions its device runs and the cores and GPUs it
has (a `rollout.dtype` no live worker of its queue can run, or more `execution.train_processes`
than any has, is refused at submission)."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone

from rlcore.config import RunConfig


def needed_queues(configs: list[RunConfig]) -> list[str]:
    """The worker queues that runs of `configs` send jobs to (training and rollout), in order."""
    found = {config.queue: None for config in configs}
    found.update({config.rollout_queue: None for config in configs if config.rollout_queue})
    return list(found)


class Worker(models.Model):
    """A worker process, as last seen by its own heartbeat (every `LAB_REAP_INTERVAL_S`)."""

    identity = models.CharField(max_length=200, unique=True, help_text="host:pid")
    queues = models.JSONField(default=list)
    precisions = models.JSONField(
        default=list, blank=True, help_text="the lower rollout precisions its device runs (bfloat16, float16)"
    )
    cores = models.PositiveIntegerField(null=True, blank=True, help_text="the CPU cores it may run on")
    gpus = models.PositiveIntegerField(null=True, blank=True, help_text="the GPUs it sees")
    last_seen = models.DateTimeField()

    class Meta:
        db_table = "experiments_worker"

    def __str__(self) -> str:
        return f"worker {self.identity} on {', '.join(self.queues)}"

    @classmethod
    def seen(
        cls,
        identity: str,
        queues: list[str],
        precisions: list[str] | None = None,
        cores: int | None = None,
        gpus: int | None = None,
    ) -> None:
        """Record that worker `identity`, listening on `queues` (its device running `precisions`,
        with `cores` CPU cores and `gpus` GPUs; None: not reported), is alive; forget long-gone
        workers."""
        now = timezone.now()
        defaults = {
            "queues": queues,
            "last_seen": now,
            "precisions": precisions or [],
            "cores": cores,
            "gpus": gpus,
        }
        cls.objects.update_or_create(identity=identity, defaults=defaults)
        cls.objects.filter(last_seen__lt=now - timedelta(days=1)).delete()

    @classmethod
    def live_queues(cls) -> set[str]:
        """Queues that a worker seen within `LAB_HEARTBEAT_TIMEOUT_S` listens on."""
        since = timezone.now() - timedelta(seconds=settings.LAB_HEARTBEAT_TIMEOUT_S)
        return {
            q
            for queues in cls.objects.filter(last_seen__gte=since).values_list("queues", flat=True)
            for q in queues
        }

    @classmethod
    def live_count(cls, queue: str) -> int:
        """Workers seen within `LAB_HEARTBEAT_TIMEOUT_S` that listen on `queue`."""
        since = timezone.now() - timedelta(seconds=settings.LAB_HEARTBEAT_TIMEOUT_S)
        return sum(
            queue in queues
            for queues in cls.objects.filter(last_seen__gte=since).values_list("queues", flat=True)
        )

    @classmethod
    def precision_problems(cls, configs: list[RunConfig]) -> list[tuple[str, str]]:
        """`rollout.dtype` settings that no live worker of the queue generating their batches can run
        (while none listens there, nothing is known: the runs wait, as `missing_for` warns)."""
        since = timezone.now() - timedelta(seconds=settings.LAB_HEARTBEAT_TIMEOUT_S)
        live = list(cls.objects.filter(last_seen__gte=since).values_list("queues", "precisions"))
        problems = []
        for queue, dtype in dict.fromkeys(
            (c.rollout_queue or c.queue, c.rollout.dtype) for c in configs if c.rollout.dtype != "same"
        ):
            there = [precisions for queues, precisions in live if queue in queues]
            if there and not any(dtype in precisions for precisions in there):
                runs = sorted({p for precisions in there for p in precisions}) or ["none below the model's"]
                problems.append(
                    (
                        "rollout.dtype",
                        f"no live worker on queue {queue} can generate in {dtype}: their devices run "
                        f"{', '.join(runs)}; choose one of those or same",
                    )
                )
        return problems

    @classmethod
    def train_process_problems(cls, configs: list[RunConfig]) -> list[tuple[str, str]]:
        """`execution.train_processes` settings above what every live worker of the run's queue
        has: its GPUs for a run on CUDA (or on `auto` where the worker has GPUs), else its cores.
        Workers that have not reported them are not counted; while none has, nothing is known."""
        since = timezone.now() - timedelta(seconds=settings.LAB_HEARTBEAT_TIMEOUT_S)
        live = list(cls.objects.filter(last_seen__gte=since).values_list("queues", "cores", "gpus"))
        problems = []
        for queue, device, processes in dict.fromkeys(
            (c.queue, c.device, c.execution.train_processes)
            for c in configs
            if c.execution.train_processes > 1
        ):
            there = [
                ("GPUs", gpus) if device == "cuda" or (device == "auto" and gpus) else ("cores", cores)
                for queues, cores, gpus in live
                if queue in queues and cores is not None
            ]
            if there and not any(processes <= count for _, count in there):
                most = max(there, key=lambda had: had[1])
                problems.append(
                    (
                        "execution.train_processes",
                        f"execution.train_processes = {processes}: no live worker on queue {queue} has that "
                        f"many {most[0]} (one trainer process each; the most any has is {most[1]})",
                    )
                )
        return problems

    @classmethod
    def missing_for(cls, configs: list[RunConfig]) -> list[str]:
        """What to warn about before submitting runs of `configs`: one line per queue they need
        that no live worker listens on."""
        live = cls.live_queues()
        return [
            f"no worker is listening on queue {queue}: its runs will wait until one starts"
            for queue in needed_queues(configs)
            if queue not in live
        ]
