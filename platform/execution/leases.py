"""The lease of a unit of work (a run, a rollout job): every transition is one conditional UPDATE
of its row, so one attempt is claimed by one worker, and a late message or a late report of a
worker that lost the lease changes nothing."""

from __future__ import annotations

from django.db import models, transaction
from django.db.models import Q
from django.utils import timezone

from execution import messages

DISPATCHED_AT_HELP = (
    "when a message for the current attempt was last sent to the broker; empty while the broker "
    "could not be reached (a worker's dispatcher sends it again)"
)


class Leased(models.Model):
    """A row a worker leases one attempt at a time; each subclass names its `status` field and
    `TASK`, the Celery task that makes it."""

    QUEUED, RUNNING = "queued", "running"
    TASK = ""

    attempt = models.PositiveIntegerField(default=1)
    dispatched_at = models.DateTimeField(
        null=True, blank=True, default=timezone.now, help_text=DISPATCHED_AT_HELP
    )
    worker = models.CharField(max_length=200, blank=True)
    heartbeat = models.DateTimeField(null=True, blank=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        abstract = True

    def _update(self, condition: Q, reload: bool = True, **changes) -> bool:
        """Apply `changes` iff the row still matches `condition`; either way, reload self unless
        `reload` is False (the caller is done with this object).

        Only the row's own columns are reloaded: no transition changes a foreign key, so the
        related objects already fetched (a job's run) stay cached instead of costing a query on
        next use (outside any outage retry the caller wraps this in)."""
        done = type(self).objects.filter(condition, pk=self.pk).update(**changes) == 1
        if reload:
            self.refresh_from_db(fields=[f.attname for f in self._meta.concrete_fields if not f.is_relation])
        return done

    def claim(self, worker: str, attempt: int) -> bool:
        """queued → running for this attempt; False if someone else has it or it is over."""
        return self._update(Q(status=self.QUEUED, attempt=attempt), **self.claim_changes(worker))

    @classmethod
    def claim_pk(cls, pk: int, worker: str, attempt: int) -> bool:
        """`claim` of row `pk` without fetching it first: one UPDATE."""
        return (
            cls.objects.filter(pk=pk, status=cls.QUEUED, attempt=attempt).update(**cls.claim_changes(worker))
            == 1
        )

    @classmethod
    def claim_changes(cls, worker: str) -> dict:
        now = timezone.now()
        return {
            "status": cls.RUNNING,
            "worker": worker,
            "heartbeat": now,
            "started": now,
            "finished": None,
            "error": "",
            **cls.claim_resets(),
        }

    @classmethod
    def claim_resets(cls) -> dict:
        """More fields a claim resets (none by default)."""
        return {}

    def enqueue(self) -> None:
        """Send the message of this attempt once the current transaction commits; best-effort: if
        the broker cannot be reached, the row stays queued with no `dispatched_at`, and a worker's
        dispatcher sends it when the broker is back."""
        model, pk, attempt, queue = type(self), self.pk, self.attempt, self.queue
        transaction.on_commit(lambda: model.send(pk, attempt, queue))

    @classmethod
    def send(cls, pk: int, attempt: int, queue: str) -> bool:
        """Send the message of attempt `attempt` of row `pk` now; False, and the row's
        `dispatched_at` cleared, when the broker could not take it."""
        if messages.send(cls.TASK, pk, attempt, queue):
            return True
        cls.objects.filter(pk=pk, attempt=attempt, status=cls.QUEUED).update(dispatched_at=None)
        return False
