"""The database decides, the broker only delivers.

Queued runs and rollout jobs are rows; a message ("execute run N, attempt A", "generate rollout
job J, attempt A") only wakes a worker, and a duplicate one does nothing (claims are conditional
UPDATEs). So sending is best-effort and a lost message is sent again:

- `send` hands one message to the broker. When the broker cannot be reached it logs that and
  clears the row's `dispatched_at`; the request that queued the work still succeeds.
- `dispatch` (every worker runs it every `LAB_DISPATCH_INTERVAL_S`, `manage.py reap` once) sends
  again what may be missing, looking only at work queued for longer than `LAB_DISPATCH_GRACE_S`
  since its last message ("due"), so a message still on its way is not doubled:
  * runs: the messages of a queue are interchangeable (a worker claims the queue's next run,
    `Run.claim_next`), so per queue it sends as many messages as the due runs that could start
    now (within their team's `LAB_TEAM_MAX_RUNNING`) outnumber those waiting in the broker;
  * rollout jobs: a message names its job, so it sends the due jobs whose send failed, and every
    due job of a queue that holds fewer messages than were sent for its due jobs (a broker
    restart lost some, and which is unknown).
  Several dispatchers (one per worker) do not send the same message twice: each first moves the
  row's `dispatched_at` forward with a conditional UPDATE, and only the one that did sends.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from experiments.models import RolloutJob, Run

log = logging.getLogger(__name__)

# What a page or the API adds when work was queued but its message could not be sent.
NOT_SENT = (
    "the message broker cannot be reached right now: the work stays queued and is sent to a worker "
    "as soon as the broker is back"
)

TASKS = {Run: "workers.tasks.execute_run", RolloutJob: "workers.tasks.generate_batch"}


def send(model: type[Run] | type[RolloutJob], pk: int, attempt: int, queue: str) -> bool:
    """Send the message of attempt `attempt` of run or rollout job `pk` to `queue`. False (logged,
    and the row's `dispatched_at` cleared) when the broker could not take it."""
    from lab.celery import app

    try:
        app.send_task(TASKS[model], args=[pk, attempt], queue=queue)
    except Exception as exc:
        log.warning(
            "could not send %s %s attempt %s to queue %s (%s: %s); it stays queued and is sent "
            "when the broker is back",
            model.__name__,
            pk,
            attempt,
            queue,
            type(exc).__name__,
            exc,
        )
        model.objects.filter(pk=pk, attempt=attempt, status=model.QUEUED).update(dispatched_at=None)
        return False
    return True


def _resend(model, rows: list[tuple[int, int, datetime | None]], queue: str, now: datetime) -> list[str]:
    """Send the message of each (pk, attempt, dispatched_at) row that no other dispatcher took
    meanwhile; stop at the first failure (the broker went away). What was sent, in words."""
    sent = []
    for pk, attempt, dispatched_at in rows:
        # dispatched_at=None matches IS NULL: a row whose send failed.
        mine = model.objects.filter(pk=pk, attempt=attempt, status=model.QUEUED, dispatched_at=dispatched_at)
        if not mine.update(dispatched_at=now):
            continue
        if not send(model, pk, attempt, queue):
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
