"""The resend pass: queued runs and rollout jobs whose message may be missing get it again. Every
worker runs `dispatch` every `LAB_DISPATCH_INTERVAL_S` (`manage.py reap` once); how it decides what
is missing without doubling what is on its way: docs/architecture.md, "The database decides"."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from experiments.models import RolloutJob, Run


def _resend(model, rows: list[tuple[int, int, datetime | None]], queue: str, now: datetime) -> list[str]:
    """Send the message of each (pk, attempt, dispatched_at) row that no other dispatcher took
    meanwhile; stop at the first failure (the broker went away). What was sent, in words."""
    sent = []
    for pk, attempt, dispatched_at in rows:
        # dispatched_at=None matches IS NULL: a row whose send failed.
        mine = model.objects.filter(pk=pk, attempt=attempt, status=model.QUEUED, dispatched_at=dispatched_at)
        if not mine.update(dispatched_at=now):
            continue
        if not model.send(pk, attempt, queue):
            break
        sent.append(f"{model.__name__} {pk} attempt {attempt} to queue {queue}")
    return sent


def _runs_missing(queue: str, due: Q, waiting: int) -> list[tuple[int, int, datetime | None]]:
    cap = settings.LAB_TEAM_MAX_RUNNING
    room = {team: cap - n for team, n in Run.running_per_team().items()} if cap else {}
    startable = []
    for pk, attempt, dispatched_at, team in (
        Run.objects.filter(due, status=Run.QUEUED, queue=queue)
        .order_by("id")
        .values_list("id", "attempt", "dispatched_at", "experiment__team")
    ):
        if cap:
            room.setdefault(team, cap)
            if room[team] <= 0:
                continue
            room[team] -= 1
        startable.append((pk, attempt, dispatched_at))
    return startable[: max(0, len(startable) - waiting)]


def _jobs_missing(queue: str, due: Q, waiting: int) -> list[tuple[int, int, datetime | None]]:
    rows = list(
        RolloutJob.objects.filter(due, status=RolloutJob.QUEUED, queue=queue)
        .order_by("id")
        .values_list("id", "attempt", "dispatched_at")
    )
    not_sent = [row for row in rows if row[2] is None]
    # Fewer messages wait than were sent for these jobs: some were lost, and which is unknown.
    return rows if len(rows) - len(not_sent) > waiting else not_sent


def dispatch() -> list[str]:
    """One pass over the queues with queued work: send the messages that may be missing; return
    what was sent, in words. Raises when the broker cannot be reached (the caller tries again)."""
    from lab.celery import app

    now = timezone.now()
    due = Q(dispatched_at=None) | Q(dispatched_at__lt=now - timedelta(seconds=settings.LAB_DISPATCH_GRACE_S))
    run_queues = set(Run.objects.filter(due, status=Run.QUEUED).values_list("queue", flat=True))
    job_queues = set(RolloutJob.objects.filter(due, status=RolloutJob.QUEUED).values_list("queue", flat=True))
    if not run_queues and not job_queues:
        return []
    sent: list[str] = []
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        for queue in sorted(run_queues | job_queues):
            waiting = channel.queue_declare(queue=queue, passive=False).message_count
            if queue in run_queues:
                sent += _resend(Run, _runs_missing(queue, due, waiting), queue, now)
            if queue in job_queues:
                sent += _resend(RolloutJob, _jobs_missing(queue, due, waiting), queue, now)
    return sent
