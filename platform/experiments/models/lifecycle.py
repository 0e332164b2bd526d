"""A run's lifecycle as a mixin of `Run`: the transitions (`queued → running → succeeded | failed |
cancelled`, plus `lost`; every one a conditional UPDATE, `execution.leases`), retries within the
team's queued cap, the reap of runs whose worker went silent, and what the worker that owns a run
writes to it while it runs (heartbeats, provenance, notes). A transition that ends an attempt
sends `experiments.signals.run_ended` (alerts listen)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone
from pydantic import ValidationError

from accounts.models import Team
from experiments.models.jobs import RolloutJob
from experiments.signals import run_ended
from experiments.text import public_error
from rlcore.config import error_list


class Lifecycle:
    """`Run`'s transitions and its owner's writes; the methods read `Run`'s statuses and fields
    through `cls` and `self`."""

    @classmethod
    def queued_cap_refusal(cls, team: Team, adding: int) -> str:
        """Why `team` may not queue `adding` more runs now ("" if it may): `LAB_TEAM_MAX_QUEUED`."""
        cap = settings.LAB_TEAM_MAX_QUEUED
        if not cap:
            return ""
        queued = cls.objects.filter(experiment__team=team, status=cls.QUEUED).count()
        if queued + adding <= cap:
            return ""
        return (
            f"team {team} has {queued} queued run{'s' if queued != 1 else ''}; {adding} more would exceed "
            f"the limit of {cap} queued runs per team (LAB_TEAM_MAX_QUEUED): wait for some to start, "
            "or cancel some"
        )

    def record_provenance(self, worker: str, record: dict) -> None:
        """Store this attempt's provenance beside the earlier attempts' (`provenance_history`),
        pinning the experiment's θ0 and dataset files on its first run (`Experiment.pin`).

        Raises `DatasetMismatch` or `Theta0Mismatch` (nothing stored) when the worker read other
        dataset bytes or loaded other θ0 bytes than the experiment's runs did before, this run's
        earlier attempts included: one experiment never mixes datasets or initial models.
        """
        self.experiment.pin(record["theta0_sha256"], self.datasets_read(record))
        with transaction.atomic():
            row = (
                type(self)
                .objects.select_for_update()
                .filter(pk=self.pk, status=self.RUNNING, worker=worker)
                .values("attempt", "provenance_history")
                .first()
            )
            if row is None:
                return
            # A retried call (a database outage) replaces its own attempt's entry.
            earlier = [entry for entry in row["provenance_history"] if entry["attempt"] != row["attempt"]]
            type(self).objects.filter(pk=self.pk).update(
                provenance=record,
                provenance_history=[*earlier, {"attempt": row["attempt"], "provenance": record}],
            )

    def add_note(self, worker: str, text: str) -> bool:
        """Append a note to the run while `worker` executes it (one UPDATE under the row's lock)."""
        with transaction.atomic():
            notes = (
                type(self)
                .objects.select_for_update()
                .filter(pk=self.pk, status=self.RUNNING, worker=worker)
                .values_list("notes", flat=True)
                .first()
            )
            if notes is None:
                return False
            note = {"at": timezone.now().isoformat(), "attempt": self.attempt, "text": public_error(text)}
            type(self).objects.filter(pk=self.pk).update(notes=[*notes, note])
        return True

    @classmethod
    def claim_resets(cls) -> dict:
        """A new attempt starts with no phase of its own yet, and no summary (the last attempt's)."""
        return {"phase": "", "phase_detail": {}, "summary": {}}

    def beat(self, worker: str, progress: int, phase: str = "", phase_detail: dict | None = None) -> bool:
        """Heartbeat from the worker executing the run, with its progress and phase; False once it
        no longer owns the run."""
        return (
            type(self)
            .objects.filter(pk=self.pk, status=self.RUNNING, worker=worker)
            .update(heartbeat=timezone.now(), progress=progress, phase=phase, phase_detail=phase_detail or {})
            == 1
        )

    def hold(self, worker: str) -> bool:
        """Lock the run's row until the transaction ends if `worker` still executes it (the
        heartbeat's conditional UPDATE); False once it no longer does: what a worker writes for a
        run (points, seals, checkpoint hashes) goes in only under this."""
        return (
            type(self)
            .objects.filter(pk=self.pk, status=self.RUNNING, worker=worker)
            .update(heartbeat=timezone.now())
            == 1
        )

    def stop_requested(self, worker: str) -> bool:
        """True when the run was cancelled or taken away from `worker` (e.g. reaped as lost)."""
        return (
            not type(self)
            .objects.filter(pk=self.pk, status=self.RUNNING, worker=worker, cancel_requested=None)
            .exists()
        )

    def finish(self, worker: str, summary: dict[str, float | None]) -> bool:
        """running → succeeded, or → cancelled if a cancel arrived while it ran; `summary` is the
        trainer's, to which the collapse keys are added."""
        owned = Q(status=self.RUNNING, worker=worker)
        now = timezone.now()
        summary = {**summary, **self.collapse_summary()}
        if self._update(
            owned & Q(cancel_requested=None), status=self.SUCCEEDED, finished=now, summary=summary
        ) or self._update(owned, status=self.CANCELLED, finished=now, summary=summary):
            run_ended.send_robust(type(self), run=self, status=self.status, attempt=self.attempt)
            return True
        return False

    def fail(self, worker: str, error: str, execution: dict[str, float] | None = None) -> bool:
        """running → failed with `error`, and a summary of the points it logged
        (`summary_from_points`) plus, if given and something was logged, the execution report of a
        distributed or async run (`DatabaseSource.summary`)."""
        summary = self.summary_from_points()
        if summary and execution:
            summary.update(execution)
        if self._update(
            Q(status=self.RUNNING, worker=worker),
            status=self.FAILED,
            finished=timezone.now(),
            error=public_error(error),
            summary=summary,
        ):
            run_ended.send_robust(type(self), run=self, status=self.FAILED, attempt=self.attempt)
            return True
        return False

    def set_archived(self, archived: bool) -> None:
        """Set the run aside (kept with all it logged, cited where it was cited, but left out of the
        lists, the comparisons and the claims) or bring it back. Not while it is queued or running."""
        if archived and self.is_active:
            raise ValueError(f"run {self.pk} is {self.status}: cancel it, or let it end, before archiving it")
        type(self).objects.filter(pk=self.pk).update(archived=timezone.now() if archived else None)
        self.refresh_from_db(fields=["archived"])

    def cancel(self) -> bool:
        """A queued run is cancelled at once; a running one stops at its next step boundary.
        Either way its rollout jobs that have not finished are cancelled."""
        now = timezone.now()
        with transaction.atomic():
            done = self._update(
                Q(status=self.QUEUED), status=self.CANCELLED, cancel_requested=now, finished=now
            ) or self._update(Q(status=self.RUNNING, cancel_requested=None), cancel_requested=now)
            if done:
                RolloutJob.cancel_for(self)
        return done

    def retry_refusal(self) -> str:
        """Why `retry` would refuse this run now ("" if it would not)."""
        if refusal := self.read_only_refusal("retried"):
            return refusal
        if self.status not in self.RETRYABLE:
            return f"run {self.pk} is {self.status}; only failed, cancelled or lost runs can be retried"
        if self.attempt >= settings.LAB_MAX_ATTEMPTS:
            return (
                f"run {self.pk} has used all {settings.LAB_MAX_ATTEMPTS} attempts (LAB_MAX_ATTEMPTS); "
                "start a new sweep to run it again"
            )
        try:
            self.run_config()
        except ValidationError as exc:
            problems = "; ".join(f"{field}: {message}" for field, message in error_list(exc))
            return f"run {self.pk} cannot succeed: its config no longer passes today's checks ({problems})"
        team = Team.objects.filter(experiments__runs=self.pk).first()
        if team is None:
            return f"run {self.pk} no longer exists"
        return self.queued_cap_refusal(team, 1)

    def retry(self, within_cap: bool = True) -> bool:
        """failed / cancelled / lost → queued as a new attempt, resuming from its last checkpoint,
        while the run has attempts left (manual retries count against LAB_MAX_ATTEMPTS too) and,
        with `within_cap`, its team stays within LAB_TEAM_MAX_QUEUED: checked under the team's row
        lock, as sweeps are, so concurrent retries cannot overrun it. Raises `self.DoesNotExist`
        if the run was deleted meanwhile.

        The previous attempt's error stays visible until a worker claims the new one.
        """
        with transaction.atomic():
            if within_cap:
                team_id = (
                    type(self)
                    .objects.filter(pk=self.pk)
                    .values_list("experiment__team_id", flat=True)
                    .first()
                )
                if team_id is None:
                    raise self.DoesNotExist(f"run {self.pk} no longer exists")
                team = Team.objects.select_for_update().get(pk=team_id)
                if self.queued_cap_refusal(team, 1):
                    return False
            done = self._update(
                Q(status__in=self.RETRYABLE, attempt__lt=settings.LAB_MAX_ATTEMPTS),
                status=self.QUEUED,
                attempt=F("attempt") + 1,
                cancel_requested=None,
                worker="",
                finished=None,
                dispatched_at=timezone.now(),
                # Queued again: no step done and no start of this attempt yet (not the last one's).
                progress=0,
                started=None,
                phase="",
                phase_detail={},
            )
            if done:
                self.enqueue()
        if done:
            self.refresh_from_db(fields=["dispatched_at"])  # cleared if the message could not be sent
        return done

    def mark_lost(self, stale_before: datetime) -> bool:
        """running → lost if no heartbeat arrived since `stale_before`, with a summary of the points
        it logged (kept if it is cancelled or out of attempts; a new attempt starts without)."""
        return self._update(
            Q(status=self.RUNNING, heartbeat__lt=stale_before),
            status=self.LOST,
            finished=timezone.now(),
            error=f"worker {self.worker} stopped sending heartbeats",
            summary=self.summary_from_points(),
        )

    @classmethod
    def reap(cls) -> list:
        """Mark runs with stale heartbeats `lost`; re-queue those with attempts left, end those with a
        pending cancel `cancelled`. Returns them."""
        stale_before = timezone.now() - timedelta(seconds=settings.LAB_HEARTBEAT_TIMEOUT_S)
        reaped = []
        for run in cls.objects.filter(status=cls.RUNNING, heartbeat__lt=stale_before):
            # One transaction per run: nobody sees `lost` in between a run that is queued again.
            with transaction.atomic():
                if not run.mark_lost(stale_before):
                    continue
                lost_attempt = run.attempt
                if run.cancel_requested is not None:
                    # Cancel is final: a run cancelled before its worker died is not trained again.
                    run._update(Q(status=cls.LOST), status=cls.CANCELLED)
                    RolloutJob.cancel_for(run)
                elif run.attempt < settings.LAB_MAX_ATTEMPTS:
                    run.retry(within_cap=False)  # already admitted: a lost worker is no new submission
                ended = cls.CANCELLED if run.status == cls.CANCELLED else cls.LOST
                run_ended.send_robust(cls, run=run, status=ended, attempt=lost_attempt)
            reaped.append(run)
        return reaped
