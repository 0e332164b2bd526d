"""Whose turn it is: how a worker picks the next queued run of its queue (teams take turns, a
team at its running cap waits, a run measured alone gets an idle pool), as a mixin of `Run`."""

from __future__ import annotations

from datetime import UTC, datetime

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Min

from accounts.models import Team

NEVER = datetime.min.replace(tzinfo=UTC)  # a team never served goes before any that was


class TakingTurns:
    """`Run`'s claims in turn; the methods read `Run`'s statuses and fields through `cls`."""

    @classmethod
    def running_per_team(cls) -> dict[int, int]:
        """Team id → how many of its runs are running now (on any queue)."""
        return dict(
            cls.objects.filter(status=cls.RUNNING)
            .values_list("experiment__team")
            .annotate(n=Count("id"))
            .order_by()
        )

    @classmethod
    def claim_next(cls, queue: str, worker: str):
        """Claim the next queued run of `queue` for `worker`, whatever order the broker delivers
        its messages in. Teams take turns: the team with the fewest running runs goes first, then
        the one served least recently (`Team.last_claimed`), then the one whose oldest queued run
        is oldest; within a team, first in, first out. A team running `LAB_TEAM_MAX_RUNNING` runs
        waits. A serial run (measured alone) starts only when no run is running; while it runs,
        or while it is next on any queue and waits for the pool to drain, no other run starts.
        None if no run can start."""
        cap = settings.LAB_TEAM_MAX_RUNNING
        while True:
            pick = cls._next_in_turn(queue)
            if pick is None:
                return None
            oldest, team = pick
            with transaction.atomic():
                # Claims take turns (the first team's row as the lock), so none starts beside a
                # run measured alone, and two workers never both take a team's last slot.
                Team.objects.select_for_update().order_by("pk").first()
                run = cls.objects.get(pk=oldest)
                if cls._held_for_serial(queue, run):
                    return None
                if cap and cls.objects.filter(status=cls.RUNNING, experiment__team=team).count() >= cap:
                    continue
                if run.claim(worker, run.attempt):
                    Team.objects.filter(pk=team).update(last_claimed=run.started)
                    return run
            # Another worker claimed it (or it was cancelled) in the meantime: look again.

    @classmethod
    def _next_in_turn(cls, queue: str) -> tuple[int, int] | None:
        """(the run, its team) whose turn it is on `queue` (`claim_next`), or None."""
        cap = settings.LAB_TEAM_MAX_RUNNING
        heads = dict(
            cls.objects.filter(status=cls.QUEUED, queue=queue)
            .values_list("experiment__team")
            .annotate(oldest=Min("id"))
            .order_by()
        )
        running = cls.running_per_team()
        served = dict(Team.objects.filter(pk__in=heads).values_list("pk", "last_claimed"))
        turns = sorted(
            (running.get(team, 0), served[team] or NEVER, oldest, team)
            for team, oldest in heads.items()
            if not cap or running.get(team, 0) < cap
        )
        return (turns[0][2], turns[0][3]) if turns else None

    @classmethod
    def _held_for_serial(cls, queue: str, run) -> bool:
        """Whether `run` must wait for a run measured alone: one runs, `run` is one and others
        run (the pool drains), or another queue's next run is one (it drains for that)."""
        if cls.objects.filter(status=cls.RUNNING, serial=True).exists():
            return True
        if run.serial:
            return cls.objects.filter(status=cls.RUNNING).exists()
        waiting = cls.objects.filter(status=cls.QUEUED, serial=True).exclude(queue=queue)
        for other in waiting.values_list("queue", flat=True).distinct():
            pick = cls._next_in_turn(other)
            if pick is not None and cls.objects.filter(pk=pick[0], serial=True).exists():
                return True
        return False
