"""The worker registry: each worker process's own heartbeat, which tells a queue nobody listens on
from one whose workers are busy."""

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
    last_seen = models.DateTimeField()

    class Meta:
        db_table = "experiments_worker"

    def __str__(self) -> str:
        return f"worker {self.identity} on {', '.join(self.queues)}"

    @classmethod
    def seen(cls, identity: str, queues: list[str]) -> None:
        """Record that worker `identity`, listening on `queues`, is alive; forget long-gone workers."""
        now = timezone.now()
        cls.objects.update_or_create(identity=identity, defaults={"queues": queues, "last_seen": now})
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
    def missing_for(cls, configs: list[RunConfig]) -> list[str]:
        """What to warn about before submitting runs of `configs`: one line per queue they need
        that no live worker listens on."""
        live = cls.live_queues()
        return [
            f"no worker is listening on queue {queue}: its runs will wait until one starts"
            for queue in needed_queues(configs)
            if queue not in live
        ]
