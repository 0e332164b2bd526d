"""Teams, experiments (one submitted sweep), runs and what runs report.

A `Run` carries its own lifecycle: `queued → running → succeeded | failed | cancelled`,
plus `lost` when its worker stopped heartbeating. Every transition is one conditional
UPDATE on the row, so two workers can never both claim a run, and a late or duplicate
message finds nothing to do. Postgres (or SQLite locally) is the source of truth; the
broker only carries "execute run N, attempt A", and a worker that gets such a message executes
the next queued run of that run's queue (`claim_next`): teams take turns, and within a team runs
start first in, first out. Sending a message is best-effort (`experiments.dispatch`): work stays
queued when the broker is down, and a worker's dispatcher sends what may be missing later.
"""

from __future__ import annotations

import csv
import hashlib
import io
import secrets
import shutil
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, models, transaction
from django.db.models import Count, F, Min, Q
from django.utils import timezone
from pydantic import ValidationError

from experiments.collapse import METRIC as COLLAPSE_METRIC
from experiments.collapse import Collapse, find_collapse
from experiments.templatetags.units import seconds
from rlcore.config import RunConfig, error_list
from rlcore.sinks import SUMMARY_LATEST


def storable(text: str) -> str:
    """`text` as PostgreSQL can store it: a NUL character (which model output and error messages
    can hold) becomes U+FFFD, the replacement character."""
    return text.replace("\x00", "\ufffd")


def public_error(text: str) -> str:
    """An error message as the pages and the API show it: storable, and with paths inside
    `LAB_VAR_DIR` relative to it (`runs/<key>/…`), so no server path reaches a team member."""
    return storable(text).replace(f"{settings.VAR_DIR}/", "")


def validation_context() -> dict[str, list[str]]:
    """What `RunConfig` validation needs beyond the config: the folders runs may read from."""
    return {"data_roots": settings.LAB_DATA_ROOTS, "model_roots": settings.LAB_MODEL_ROOTS}


def needed_queues(configs: list[RunConfig]) -> list[str]:
    """The worker queues that runs of `configs` send jobs to (training and rollout), in order."""
    found = {config.queue: None for config in configs}
    found.update({config.rollout_queue: None for config in configs if config.rollout_queue})
    return list(found)


def queued_cap_refusal(team: Team, adding: int) -> str:
    """Why `team` may not queue `adding` more runs now ("" if it may): `LAB_TEAM_MAX_QUEUED`."""
    cap = settings.LAB_TEAM_MAX_QUEUED
    if not cap:
        return ""
    queued = Run.objects.filter(experiment__team=team, status=Run.QUEUED).count()
    if queued + adding <= cap:
        return ""
    return (
        f"team {team} has {queued} queued run{'s' if queued != 1 else ''}; {adding} more would exceed "
        f"the limit of {cap} queued runs per team (LAB_TEAM_MAX_QUEUED): wait for some to start, "
        "or cancel some"
    )


class Worker(models.Model):
    """A worker process, as last seen by its own heartbeat (every `LAB_REAP_INTERVAL_S`): what
    tells a queue nobody listens on from one whose worker is busy."""

    identity = models.CharField(max_length=200, unique=True, help_text="host:pid")
    queues = models.JSONField(default=list)
    last_seen = models.DateTimeField()

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


class Team(models.Model):
    name = models.CharField(max_length=100, unique=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, through="Membership", related_name="teams")
    created = models.DateTimeField(auto_now_add=True)
    last_claimed = models.DateTimeField(
        null=True, blank=True, help_text="when a worker last started one of its runs (teams take turns)"
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def is_admin(self, user) -> bool:
        return self.memberships.filter(user=user, is_admin=True).exists()


class Membership(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    is_admin = models.BooleanField(default=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="one_membership_per_team")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team}{' (admin)' if self.is_admin else ''}"


class Invitation(models.Model):
    """A team admin's invitation for a user to join the team: nobody becomes a member of a team
    without accepting one (or through the admin). Superusers are never invited."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="invitations")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="team_invitations"
    )
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    is_admin = models.BooleanField(default=False)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="one_invitation_per_team")]

    def __str__(self) -> str:
        return f"{self.user} invited to {self.team}{' (admin)' if self.is_admin else ''}"

    @classmethod
    def invite(cls, team: Team, username: str, invited_by, is_admin: bool) -> None:
        """Invite the active account called `username` if there is one that is not a superuser
        and not in the team yet; the caller is never told whether there was."""

        user = (
            get_user_model()
            .objects.filter(username=username, is_active=True, is_superuser=False)
            .exclude(memberships__team=team)
            .first()
        )
        if user is not None:
            cls.objects.update_or_create(
                team=team, user=user, defaults={"invited_by": invited_by, "is_admin": is_admin}
            )

    def accept(self) -> Membership:
        with transaction.atomic():
            membership, _ = Membership.objects.get_or_create(
                team=self.team, user=self.user, defaults={"is_admin": self.is_admin}
            )
            self.delete()
        return membership


def _remove_folders(folders: list[Path]) -> None:
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


class Theta0Mismatch(ValueError):
    """A worker loaded other initial weights than the experiment's other runs started from."""


class ExperimentActive(Exception):
    """An experiment cannot be deleted while any of its runs is queued or running."""


class Experiment(models.Model):
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="experiments")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="experiments")
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    spec = models.JSONField(help_text="the submitted sweep: base config, presets, staleness settings, seeds")
    created = models.DateTimeField(auto_now_add=True)
    archived = models.DateTimeField(
        null=True, blank=True, help_text="when it was hidden from the lists; empty while it is shown"
    )
    theta0_sha256 = models.CharField(
        max_length=64, blank=True, help_text="θ0 of its runs, pinned by the first run that loaded it"
    )

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self) -> str:
        return self.name

    @classmethod
    def visible_to(cls, user) -> models.QuerySet[Experiment]:
        return cls.objects.filter(team__memberships__user=user)

    @property
    def is_active(self) -> bool:
        return self.runs.filter(status__in=Run.ACTIVE).exists()

    def cancel(self) -> int:
        """Cancel every queued or running run (`Run.cancel`, rollout jobs included); how many were."""
        return sum(run.cancel() for run in self.runs.filter(status__in=Run.ACTIVE))

    def archive(self) -> None:
        """Hide the experiment from the experiment and run lists; nothing is deleted."""
        Experiment.objects.filter(pk=self.pk, archived=None).update(archived=timezone.now())
        self.refresh_from_db(fields=["archived"])

    def unarchive(self) -> None:
        Experiment.objects.filter(pk=self.pk).update(archived=None)
        self.refresh_from_db(fields=["archived"])

    def deletion_report(self) -> dict[str, int]:
        """What deleting the experiment deletes: its runs and the points and completions they logged."""
        return {
            "runs": self.runs.count(),
            "points": MetricPoint.objects.filter(run__experiment=self).count(),
            "completions": Completion.objects.filter(run__experiment=self).count(),
        }

    def delete_with_files(self) -> None:
        """Delete the experiment, its runs and all they logged, then, once that has committed,
        the runs' folders under `LAB_RUNS_DIR` (checkpoints, buffers).

        Raises `ExperimentActive` while a run is queued or running: a worker would go on writing.
        The runs stay locked until the delete commits, so none is retried in between.
        """
        with transaction.atomic():
            runs = list(Run.objects.select_for_update().filter(experiment=self))
            active = sum(run.is_active for run in runs)
            if active:
                raise ExperimentActive(
                    f"{self.name} has {active} queued or running run{'s' if active != 1 else ''}; "
                    "cancel it first, then delete it once they have stopped"
                )
            folders = [run.checkpoint_dir.parent for run in runs]
            self.delete()
            transaction.on_commit(lambda: _remove_folders(folders))

    def progress_report(self) -> dict[str, Any]:
        """The sweep's progress: each run with its `Run.progress_report()`, runs and steps done,
        and an ETA: the steps left at the mean s/step of the runs training now, shared among them."""
        runs = list(self.runs.all())
        live = Worker.live_queues()
        queues = QueueState.read({run.queue for run in runs if run.status == Run.QUEUED})
        rows = [(run, run.progress_report(live, queues)) for run in runs]
        rates = [report["s_per_step"] for _, report in rows if report["s_per_step"] is not None]
        steps_left = sum(max(0, run.steps - run.progress) for run in runs if run.is_active)
        running = sum(run.status == Run.RUNNING for run in runs)
        eta_s = None
        if rates and running:
            eta_s = steps_left * (sum(rates) / len(rates)) / running
        started = [run.started for run in runs if run.started is not None]
        finished = [run.finished for run in runs if run.finished is not None]
        over = not any(run.is_active for run in runs)
        end = max(finished) if over and finished else timezone.now()
        return {
            "rows": rows,
            "started": min(started, default=None),
            "finished": max(finished) if over and finished else None,
            "duration_s": (end - min(started)).total_seconds() if started else None,
            "runs": len(runs),
            "runs_done": sum(not run.is_active for run in runs),
            "steps": sum(run.steps for run in runs),
            "steps_done": sum(min(run.progress, run.steps) for run in runs),
            "eta_s": eta_s if steps_left else None,
        }


class SweepTemplate(models.Model):
    """A sweep a team saved to start new ones from (`Experiment.spec`'s form): the new-sweep page
    lists its team's templates beside the built-in ones."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="sweep_templates")
    name = models.CharField(max_length=200)
    spec = models.JSONField(help_text="base config, presets, staleness settings, seeds")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team", "name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="one_template_name_per_team")]

    def __str__(self) -> str:
        return f"{self.name} ({self.team})"


NEVER = datetime.min.replace(tzinfo=UTC)  # a team never served goes before any that was


@dataclass(frozen=True)
class QueueState:
    """Where queued runs stand, read once for a page (two queries, not one per run): each queued
    run's place among its team's queued runs of its queue, in the order a worker takes them (first
    in, first out within a team; teams take turns, `Run.claim_next`), and per queue the running
    runs of each team."""

    place: dict[int, int]  # a queued run → its place among its team's queued runs of its queue (1: next)
    running: dict[str, dict[int, int]]

    @classmethod
    def read(cls, queues: Iterable[str]) -> QueueState:
        queues = list(queues)
        place: dict[int, int] = {}
        running: dict[str, dict[int, int]] = {}
        if queues:
            lines: dict[tuple[int, str], int] = {}
            rows = Run.objects.filter(status=Run.QUEUED, queue__in=queues).order_by("id")
            for pk, team, queue in rows.values_list("pk", "experiment__team", "queue"):
                lines[(team, queue)] = place[pk] = lines.get((team, queue), 0) + 1
            counts = (
                Run.objects.filter(status=Run.RUNNING, queue__in=queues)
                .values_list("queue", "experiment__team")
                .annotate(n=Count("id"))
                .order_by()
            )
            for queue, team, n in counts:
                running.setdefault(queue, {})[team] = n
        return cls(place, running)

    def waiting(self, run: Run, team: int) -> tuple[int | None, str]:
        """(its place among its team's queued runs of its queue, 1 = next; what it waits for)."""
        place = self.place.get(run.pk)
        ahead = (place or 1) - 1
        parts = [
            f"next of its team's runs on queue {run.queue}"
            if ahead == 0
            else f"{ahead} of its team's runs ahead of it on queue {run.queue}"
        ]
        running = self.running.get(run.queue, {})
        mine, others = running.get(team, 0), sum(n for t, n in running.items() if t != team)
        cap = settings.LAB_TEAM_MAX_RUNNING
        if cap and mine >= cap:
            parts.append(
                f"its team is at its limit of {cap} running run{'s' if cap != 1 else ''} (LAB_TEAM_MAX_RUNNING)"
            )
        elif others:
            parts.append(
                f"the workers of queue {run.queue} are running {others} run{'s' if others != 1 else ''} of "
                "other teams: teams take turns (fair share), so its team's next run starts when one ends"
            )
        return place, " · ".join(parts)


DISPATCHED_AT_HELP = (
    "when a message for the current attempt was last sent to the broker; empty while the broker "
    "could not be reached (a worker's dispatcher sends it again)"
)


class Leased:
    """The lease idiom of runs and rollout jobs: every transition is one conditional UPDATE of
    the row (`status`, `attempt`, `worker`, `heartbeat`, `started`, `finished`, `error`), so one
    attempt is claimed by one worker, and a late message or a late report of a worker that lost
    the lease changes nothing."""

    QUEUED, RUNNING = "queued", "running"

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


class Run(Leased, models.Model):
    QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED, LOST = (
        "queued",
        "running",
        "succeeded",
        "failed",
        "cancelled",
        "lost",
    )
    STATUSES = [(s, s) for s in (QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED, LOST)]
    ACTIVE = (QUEUED, RUNNING)
    RETRYABLE = (FAILED, CANCELLED, LOST)

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="runs")
    key = models.UUIDField(
        default=uuid.uuid4, unique=True, editable=False, help_text="names its checkpoint folder"
    )
    config = models.JSONField(help_text="the fully resolved RunConfig")
    preset = models.CharField(max_length=100)
    staleness = models.CharField(max_length=100)
    seed = models.IntegerField()
    queue = models.CharField(max_length=20, default="cpu")
    status = models.CharField(max_length=20, choices=STATUSES, default=QUEUED, db_index=True)
    attempt = models.PositiveIntegerField(default=1)
    cancel_requested = models.DateTimeField(null=True, blank=True)
    dispatched_at = models.DateTimeField(
        null=True, blank=True, default=timezone.now, help_text=DISPATCHED_AT_HELP
    )
    worker = models.CharField(max_length=200, blank=True)
    heartbeat = models.DateTimeField(null=True, blank=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    progress = models.IntegerField(default=0, help_text="last trainer step reported")
    phase = models.CharField(
        max_length=20, blank=True, help_text="what the running attempt is doing (rlcore.sinks.PHASES)"
    )
    phase_detail = models.JSONField(
        default=dict, blank=True, help_text="the phase's numbers, and when training steps were done"
    )
    error = models.TextField(blank=True)
    summary = models.JSONField(default=dict, blank=True)
    provenance = models.JSONField(
        default=dict,
        blank=True,
        help_text="θ0 and dataset hashes, versions, device, host (rlcore.provenance)",
    )
    notes = models.JSONField(
        default=list,
        blank=True,
        help_text="what its workers had to work around (a damaged checkpoint passed over, …): "
        "[{at, attempt, text}]",
    )
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.preset}, {self.staleness}, seed {self.seed})"

    @classmethod
    def visible_to(cls, user) -> models.QuerySet[Run]:
        return cls.objects.filter(experiment__team__memberships__user=user)

    @classmethod
    def create_for(cls, experiment: Experiment, config, **fields) -> Run:
        """A run of `experiment` for a validated `rlcore.config.RunConfig`, labelled from it."""
        return cls.objects.create(
            experiment=experiment,
            config=config.model_dump(mode="json"),
            preset=config.algorithm.preset,
            staleness=config.staleness_label,
            seed=config.seed,
            queue=config.queue,
            **fields,
        )

    def record_provenance(self, worker: str, record: dict) -> None:
        """Store this attempt's provenance, pinning the experiment's θ0 on its first run.

        Raises `Theta0Mismatch` (nothing stored) when the worker loaded other θ0 bytes than the
        experiment's other runs: one experiment never mixes initial models.
        """
        theta0 = record["theta0_sha256"]
        Experiment.objects.filter(pk=self.experiment_id, theta0_sha256="").update(theta0_sha256=theta0)
        pinned = Experiment.objects.values_list("theta0_sha256", flat=True).get(pk=self.experiment_id)
        if pinned != theta0:
            raise Theta0Mismatch(
                f"this worker loaded θ0 {theta0}, but experiment {self.experiment_id} is pinned to θ0 "
                f"{pinned}: its runs must all start from the same weights (a different model cache or "
                "model files on this worker?)"
            )
        Run.objects.filter(pk=self.pk, status=Run.RUNNING, worker=worker).update(provenance=record)

    def add_note(self, worker: str, text: str) -> bool:
        """Append a note to the run while `worker` executes it (one UPDATE under the row's lock)."""
        with transaction.atomic():
            notes = (
                Run.objects.select_for_update()
                .filter(pk=self.pk, status=Run.RUNNING, worker=worker)
                .values_list("notes", flat=True)
                .first()
            )
            if notes is None:
                return False
            note = {"at": timezone.now().isoformat(), "attempt": self.attempt, "text": public_error(text)}
            Run.objects.filter(pk=self.pk).update(notes=[*notes, note])
        return True

    def run_config(self) -> RunConfig:
        """The stored config, validated again against today's allowed data and model roots."""
        return RunConfig.model_validate(self.config, context=validation_context())

    @property
    def steps(self) -> int:
        return self.config["steps"]

    @property
    def checkpoint_dir(self) -> Path:
        return settings.LAB_RUNS_DIR / str(self.key) / "checkpoints"

    @property
    def is_active(self) -> bool:
        return self.status in Run.ACTIVE

    @property
    def duration_s(self) -> float | None:
        """Wall-clock seconds of the current attempt: start to finish, or to now while it runs;
        None before a worker started it."""
        if self.started is None:
            return None
        end = self.finished or (timezone.now() if self.status == Run.RUNNING else None)
        return None if end is None else max(0.0, (end - self.started).total_seconds())

    @property
    def is_retryable(self) -> bool:
        return self.status in Run.RETRYABLE

    @property
    def final_accuracy(self) -> float | None:
        """Held-out (greedy) accuracy after the last step: the number a comparison is about."""
        return self.summary.get("eval/accuracy")

    @property
    def collapsed(self) -> bool | None:
        """Whether the policy collapsed (`experiments.collapse`), as decided when the run ended;
        None while it has not ended (or ended before anything was logged)."""
        flag = self.summary.get("collapsed")
        return None if flag is None else bool(flag)

    def collapse(self) -> Collapse | None:
        """Where the run collapsed, from its logged held-out accuracy (None if it did not)."""
        return find_collapse(
            MetricPoint.objects.filter(run=self, name=COLLAPSE_METRIC).values_list("step", "value")
        )

    def collapse_summary(self) -> dict[str, float]:
        """The summary's collapse keys: `collapsed` (1 or 0) and, if 1, `collapsed_step`."""
        found = self.collapse()
        if found is None:
            return {"collapsed": 0.0}
        return {"collapsed": 1.0, "collapsed_step": float(found.step)}

    def summary_from_points(self) -> dict[str, float | None]:
        """The run's summary computed from the metric points it logged: for runs that ended without
        the trainer's own summary (failed, lost, cancelled while the worker was gone).

        The keys of a succeeded run's summary (`rlcore.trainer.train`) that the points give:
        `steps` (the last step logged), `completed` (1 if that is the config's last step),
        `eval/accuracy_initial` (step 0), the latest `eval/accuracy`, `reward/mean` and `kl/init`,
        and the collapse keys. Empty when nothing was logged.
        """
        points = MetricPoint.objects.filter(run=self)
        last_step = points.aggregate(last=models.Max("step"))["last"]
        if last_step is None:
            return {}
        summary: dict[str, float | None] = {
            "steps": float(last_step),
            "completed": float(last_step == self.steps),
            "eval/accuracy_initial": points.filter(name="eval/accuracy", step=0)
            .values_list("value", flat=True)
            .first(),
        }
        for name in SUMMARY_LATEST:
            latest = points.filter(name=name).order_by("-step").values_list("value", flat=True)[:1]
            if latest:
                summary[name] = latest[0]
        return {**summary, **self.collapse_summary()}

    @property
    def execution_mode(self) -> str:
        """simulated, distributed or async; runs stored before execution modes existed were simulated."""
        return self.config.get("execution", {}).get("mode", "simulated")

    @property
    def execution_report(self) -> dict[str, float] | None:
        """What a finished distributed or async run reported about its execution: mean seconds to
        publish the weights, bytes published in all, and the fractions of wall time the trainer and
        the rollout workers were idle. None for simulated runs and runs that have not finished."""
        names = {
            "publish_s_mean": "weights/publish_s_mean",
            "publish_bytes": "weights/publish_bytes",
            "trainer_idle_frac": "idle/trainer_frac",
            "rollout_idle_frac": "idle/rollout_frac",
        }
        if self.execution_mode == "simulated" or not all(name in self.summary for name in names.values()):
            return None
        return {key: self.summary[name] for key, name in names.items()}

    @property
    def needed_queues(self) -> list[str]:
        """The queues this run's jobs go to: its training queue, and its rollout queue if it has one.
        A stored config today's rules refuse (stored before a bound was added: its run fails with
        the reason when it starts) still shows, with its training queue."""
        try:
            return needed_queues([RunConfig.model_validate(self.config)])
        except ValidationError:
            return [self.queue]

    def progress_report(
        self, live_queues: set[str] | None = None, queues: QueueState | None = None
    ) -> dict[str, Any]:
        """What the run is doing now, for its row, its page and the API.

        `phase` is "waiting" (queued), "starting" (claimed, nothing reported yet), one of
        `rlcore.sinks.PHASES`, or "" once the run is over. `text` says it in words: while it waits,
        its place among its team's queued runs (`queue_position`, 1 = next) and what holds it up
        (another team's runs on the workers, its team's running cap); `no_worker` names a queue
        the run needs that no live worker listens on. While training, `s_per_step` is measured
        over the steps this attempt has done and `eta_s` extrapolates it to the last step.
        `live_queues` (from `Worker.live_queues()`) and `queues` (`QueueState.read`) save queries
        per run in a table.
        """
        detail = self.phase_detail
        report: dict[str, Any] = {
            "phase": "",
            "text": "",
            "step": self.progress,
            "steps": self.steps,
            "s_per_step": None,
            "eta_s": None,
            "warm_start": None,
            "no_worker": "",
            "queue_position": None,
        }
        if not self.is_active:
            return report
        if live_queues is None:
            live_queues = Worker.live_queues()
        dead = [queue for queue in self.needed_queues if queue not in live_queues]
        if dead:
            report["no_worker"] = f"no worker is listening on queue {' or '.join(dead)}"
        if self.status == Run.QUEUED:
            if queues is None:
                queues = QueueState.read([self.queue])
            team = self.experiment.team_id
            place, waiting = queues.waiting(self, team)
            report["queue_position"] = place
            text = f"waiting for a worker: {waiting}"
            if self.dispatched_at is None:
                text += " (the message broker could not be reached: it is sent as soon as the broker is back)"
            report.update(phase="waiting", text=text)
            return report
        report["phase"] = self.phase or "starting"
        timing = detail.get("timing")
        if timing and timing["to_step"] > timing["from_step"]:
            s_per_step = (timing["to"] - timing["from"]) / (timing["to_step"] - timing["from_step"])
            report["s_per_step"] = s_per_step
            report["eta_s"] = s_per_step * max(0, self.steps - self.progress)
        if self.phase == "preparing":
            report["text"] = "preparing the model"
        elif self.phase == "warm_start":
            report["warm_start"] = {k: detail.get(k) for k in ("step", "max_steps", "accuracy")}
            report["text"] = (
                f"preparing the model (first run only): warm start step {detail.get('step')} of at most "
                f"{detail.get('max_steps')}, held-out accuracy {detail.get('accuracy', 0):.2f} so far"
            )
        elif self.phase == "training":
            report["text"] = f"training step {detail.get('step')} of {self.steps}"
            if report["s_per_step"] is not None:
                report["text"] += f" · {report['s_per_step']:.2f} s/step · ETA {seconds(report['eta_s'])}"
        elif self.phase == "evaluating":
            report["text"] = f"evaluating at step {detail.get('step')}"
        elif self.phase == "checkpointing":
            report["text"] = f"saving a checkpoint at step {detail.get('step')}"
        else:
            report["text"] = "starting"
        return report

    def metrics_csv(self, name: str = "") -> str:
        """Every metric point of the run (or of metric `name`) as CSV: name,step,value,wall_time,
        in name and step order; a missing value (NaN or infinity when logged) is empty."""
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["name", "step", "value", "wall_time"])
        points = MetricPoint.objects.filter(run=self).order_by("name", "step")
        if name:
            points = points.filter(name=name)
        for metric, step, value, wall in points.values_list("name", "step", "value", "wall_time"):
            writer.writerow([metric, step, "" if value is None else repr(value), wall.isoformat()])
        return out.getvalue()

    def rollout_job_counts(self) -> dict[str, int]:
        """How many of the run's rollout jobs are in each status: every status, in lifecycle order."""
        found = dict(self.rollout_jobs.order_by().values_list("status").annotate(n=Count("id")))
        return {status: found.get(status, 0) for status, _ in RolloutJob.STATUSES}

    def latest_rollout_jobs(self, limit: int) -> list[RolloutJob]:
        """The run's last `limit` rollout jobs: newest step first, parts in order within a step."""
        return list(self.rollout_jobs.order_by("-step", "kind", "part")[:limit])

    def enqueue(self) -> None:
        """Send "execute this attempt" to the run's queue once the current transaction commits;
        best-effort (`experiments.dispatch.send`): if the broker cannot be reached, the run stays
        queued with no `dispatched_at`, and a worker's dispatcher sends it when the broker is back."""
        from experiments import dispatch

        run_id, attempt, queue = self.pk, self.attempt, self.queue
        transaction.on_commit(lambda: dispatch.send(Run, run_id, attempt, queue))

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
    def claim_next(cls, queue: str, worker: str) -> Run | None:
        """Claim the next queued run of `queue` for `worker`, whatever order the broker delivers
        its messages in. Teams take turns: the team with the fewest running runs goes first, then
        the one served least recently (`Team.last_claimed`), then the one whose oldest queued run
        is oldest; within a team, first in, first out. A team running `LAB_TEAM_MAX_RUNNING` runs
        waits. None if no run can start."""
        cap = settings.LAB_TEAM_MAX_RUNNING
        while True:
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
            if not turns:
                return None
            *_, oldest, team = turns[0]
            with transaction.atomic():
                # Claims of one team's runs take turns, so two workers never both take its last slot.
                Team.objects.select_for_update().filter(pk=team).first()
                if cap and cls.objects.filter(status=cls.RUNNING, experiment__team=team).count() >= cap:
                    continue
                run = cls.objects.get(pk=oldest)
                if run.claim(worker, run.attempt):
                    Team.objects.filter(pk=team).update(last_claimed=run.started)
                    return run
            # Another worker claimed it (or it was cancelled) in the meantime: look again.

    @classmethod
    def claim_resets(cls) -> dict:
        """A new attempt starts with no phase of its own yet, and no summary (the last attempt's)."""
        return {"phase": "", "phase_detail": {}, "summary": {}}

    def beat(self, worker: str, progress: int, phase: str = "", phase_detail: dict | None = None) -> bool:
        """Heartbeat from the worker executing the run, with its progress and phase; False once it
        no longer owns the run."""
        return (
            Run.objects.filter(pk=self.pk, status=Run.RUNNING, worker=worker).update(
                heartbeat=timezone.now(), progress=progress, phase=phase, phase_detail=phase_detail or {}
            )
            == 1
        )

    def stop_requested(self, worker: str) -> bool:
        """True when the run was cancelled or taken away from `worker` (e.g. reaped as lost)."""
        return not Run.objects.filter(
            pk=self.pk, status=Run.RUNNING, worker=worker, cancel_requested=None
        ).exists()

    def finish(self, worker: str, summary: dict[str, float | None]) -> bool:
        """running → succeeded, or → cancelled if a cancel arrived while it ran; `summary` is the
        trainer's, to which the collapse keys are added."""
        owned = Q(status=Run.RUNNING, worker=worker)
        now = timezone.now()
        summary = {**summary, **self.collapse_summary()}
        if self._update(
            owned & Q(cancel_requested=None), status=Run.SUCCEEDED, finished=now, summary=summary
        ):
            return True
        return self._update(owned, status=Run.CANCELLED, finished=now, summary=summary)

    def fail(self, worker: str, error: str, execution: dict[str, float] | None = None) -> bool:
        """running → failed with `error`, and a summary of the points it logged
        (`summary_from_points`) plus, if given and something was logged, the execution report of a
        distributed or async run (`DatabaseSource.summary`)."""
        summary = self.summary_from_points()
        if summary and execution:
            summary.update(execution)
        return self._update(
            Q(status=Run.RUNNING, worker=worker),
            status=Run.FAILED,
            finished=timezone.now(),
            error=public_error(error),
            summary=summary,
        )

    def cancel(self) -> bool:
        """A queued run is cancelled at once; a running one stops at its next step boundary.
        Either way its rollout jobs that have not finished are cancelled."""
        now = timezone.now()
        with transaction.atomic():
            done = self._update(
                Q(status=Run.QUEUED), status=Run.CANCELLED, cancel_requested=now, finished=now
            ) or self._update(Q(status=Run.RUNNING, cancel_requested=None), cancel_requested=now)
            if done:
                RolloutJob.cancel_for(self)
        return done

    @property
    def buffer_dir(self) -> Path:
        """Published weights and generated batches of distributed and async execution."""
        return settings.LAB_RUNS_DIR / str(self.key) / "buffer"

    def retry_refusal(self) -> str:
        """Why `retry` would refuse this run now ("" if it would not)."""
        if self.status not in Run.RETRYABLE:
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
        return queued_cap_refusal(team, 1)

    def retry(self, within_cap: bool = True) -> bool:
        """failed / cancelled / lost → queued as a new attempt, resuming from its last checkpoint,
        while the run has attempts left (manual retries count against LAB_MAX_ATTEMPTS too) and,
        with `within_cap`, its team stays within LAB_TEAM_MAX_QUEUED: checked under the team's row
        lock, as sweeps are, so concurrent retries cannot overrun it. Raises `Run.DoesNotExist`
        if the run was deleted meanwhile.

        The previous attempt's error stays visible until a worker claims the new one.
        """
        with transaction.atomic():
            if within_cap:
                team_id = Experiment.objects.filter(runs=self.pk).values_list("team_id", flat=True).first()
                if team_id is None:
                    raise Run.DoesNotExist(f"run {self.pk} no longer exists")
                team = Team.objects.select_for_update().get(pk=team_id)
                if queued_cap_refusal(team, 1):
                    return False
            done = self._update(
                Q(status__in=Run.RETRYABLE, attempt__lt=settings.LAB_MAX_ATTEMPTS),
                status=Run.QUEUED,
                attempt=F("attempt") + 1,
                cancel_requested=None,
                worker="",
                finished=None,
                dispatched_at=timezone.now(),
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
            Q(status=Run.RUNNING, heartbeat__lt=stale_before),
            status=Run.LOST,
            finished=timezone.now(),
            error=f"worker {self.worker} stopped sending heartbeats",
            summary=self.summary_from_points(),
        )

    @classmethod
    def reap(cls) -> list[Run]:
        """Mark runs with stale heartbeats `lost`; re-queue those with attempts left, end those with a
        pending cancel `cancelled`. Returns them."""
        stale_before = timezone.now() - timedelta(seconds=settings.LAB_HEARTBEAT_TIMEOUT_S)
        reaped = []
        for run in cls.objects.filter(status=cls.RUNNING, heartbeat__lt=stale_before):
            if not run.mark_lost(stale_before):
                continue
            if run.cancel_requested is not None:
                # Cancel is final: a run cancelled before its worker died is not trained again.
                run._update(Q(status=cls.LOST), status=cls.CANCELLED)
                RolloutJob.cancel_for(run)
            elif run.attempt < settings.LAB_MAX_ATTEMPTS:
                run.retry(within_cap=False)  # already admitted: a lost worker is no new submission
            reaped.append(run)
        return reaped


class RolloutJob(Leased, models.Model):
    """Work a rollout worker does for a run's trainer, of one of two kinds:
    - `batch`: generate part `part` of trainer step `step`'s batch (prompt groups
      [groups_start, groups_stop)) with policy version `version`;
    - `eval`: evaluate policy version `version` (= `step`, the policy after that step's update)
      on held-out problems [groups_start, groups_stop); the sums go to `result` and the trainer
      logs the evaluation at `step` once every part is done.

    The same lease idiom as `Run`: a conditional UPDATE claims an attempt, the worker beats a
    heartbeat while it generates, the reaper re-queues a job whose worker vanished, and a late
    message or a late finish of an older attempt changes nothing. In async execution `version`
    is chosen when the job is claimed: the newest published one.
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

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="rollout_jobs")
    kind = models.CharField(max_length=10, choices=[(BATCH, BATCH), (EVAL, EVAL)], default=BATCH)
    step = models.IntegerField()
    part = models.IntegerField(default=0)
    groups_start = models.IntegerField()
    groups_stop = models.IntegerField()
    version = models.IntegerField(null=True, blank=True, help_text="policy version; async: set at claim")
    queue = models.CharField(max_length=20, default="rollout")
    status = models.CharField(max_length=20, choices=STATUSES, default=QUEUED, db_index=True)
    attempt = models.PositiveIntegerField(default=1)
    losses = models.PositiveIntegerField(
        default=0, help_text="attempts lost with their worker (not the job's own failures)"
    )
    dispatched_at = models.DateTimeField(
        null=True, blank=True, default=timezone.now, help_text=DISPATCHED_AT_HELP
    )
    worker = models.CharField(max_length=200, blank=True)
    heartbeat = models.DateTimeField(null=True, blank=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    path = models.CharField(max_length=500, blank=True, help_text="the batch file, once done")
    sha256 = models.CharField(max_length=64, blank=True)
    result = models.JSONField(null=True, blank=True, help_text="eval jobs: the evaluation's sums, once done")
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

    def enqueue(self) -> None:
        """Send "generate this attempt" to the job's queue once the current transaction commits;
        best-effort, like `Run.enqueue`."""
        from experiments import dispatch

        job_id, attempt, queue = self.pk, self.attempt, self.queue
        transaction.on_commit(lambda: dispatch.send(RolloutJob, job_id, attempt, queue))

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
    ) -> bool:
        return self._update(
            Q(status=RolloutJob.RUNNING, worker=worker, attempt=attempt),
            reload=False,  # the worker is done with the job
            status=RolloutJob.DONE,
            version=version,
            path=path,
            sha256=sha256,
            result=result,
            finished=timezone.now(),
        )

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
    def cancel_for(cls, run: Run) -> int:
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

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="policy_versions")
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

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints")
    step = models.IntegerField()
    sha256 = models.CharField(max_length=64)
    size_bytes = models.BigIntegerField()
    created = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["run", "step"]
        constraints = [models.UniqueConstraint(fields=["run", "step"], name="one_checkpoint_per_run_step")]

    def __str__(self) -> str:
        return f"run {self.run_id} checkpoint of step {self.step}"


class MetricPoint(models.Model):
    """One metric of one run at one trainer step.

    The unique index (run, name, step) is the only index: it leads with the run, so it serves the
    run's foreign key too. On PostgreSQL it also carries `value` and `wall_time` (a covering
    index, built by migration 0002: Django's `include` would leave SQLite with no unique index at
    all), so a comparison reads one metric of hundreds of runs from the index alone.
    """

    # No index of its own: the unique index below starts with the run.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="points", db_index=False)
    name = models.CharField(max_length=100)
    step = models.IntegerField()
    value = models.FloatField(null=True, help_text="null for NaN or infinity")
    wall_time = models.DateTimeField()

    class Meta:
        ordering = ["run", "name", "step"]
        constraints = [
            # On PostgreSQL, migration 0002 rebuilds it with INCLUDE (value, wall_time).
            models.UniqueConstraint(fields=["run", "name", "step"], name="one_point_per_run_name_step")
        ]

    def __str__(self) -> str:
        return f"{self.name}@{self.step}={self.value}"

    @classmethod
    def upsert(cls, run_id: int, points: Iterable[tuple[str, int, float | None, datetime]]) -> None:
        """Write (name, step, value, wall_time) points of run `run_id`, replacing the value and
        wall time of a (run, name, step) already there. One parameterised INSERT … ON CONFLICT run
        over all points (PostgreSQL and SQLite alike): what `bulk_create(update_conflicts=True)`
        does, without a model instance and a compiled row per point. A trainer's flush of 1,000
        points took 20 ms that way, in a thread holding the interpreter lock the update needs."""
        ops = connection.ops
        table = ops.quote_name(cls._meta.db_table)
        sql = (
            f"INSERT INTO {table} (run_id, name, step, value, wall_time) VALUES (%s, %s, %s, %s, %s) "
            "ON CONFLICT (run_id, name, step) DO UPDATE SET value = excluded.value, wall_time = excluded.wall_time"
        )
        rows = [
            (run_id, name, step, value, ops.adapt_datetimefield_value(wall))
            for name, step, value, wall in points
        ]
        if rows:
            with connection.cursor() as cursor:
                cursor.executemany(sql, rows)


class Completion(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="completions")
    step = models.IntegerField()
    prompt = models.TextField()
    completion = models.TextField()
    reward = models.FloatField(null=True)

    class Meta:
        ordering = ["run", "-step", "id"]
        indexes = [models.Index(fields=["run", "step"])]

    def __str__(self) -> str:
        return f"step {self.step}: {self.prompt!r} → {self.completion!r}"


class TooManyTokens(Exception):
    """The user has `LAB_MAX_TOKENS_PER_USER` tokens already."""


class ApiToken(models.Model):
    """A bearer token for the API; only its SHA-256 digest is stored."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True, help_text="what its owner calls it")
    digest = models.CharField(max_length=64, unique=True)
    created = models.DateTimeField(auto_now_add=True)
    last_used = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"token {self.name or self.digest[:8] + '…'} of {self.user}"

    @staticmethod
    def _digest(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    @classmethod
    def issue(cls, user, name: str = "") -> str:
        """Create a token for `user` and return it; it cannot be shown again. Raises
        `TooManyTokens` when the user has `LAB_MAX_TOKENS_PER_USER` already (checked under the
        user's row lock, so concurrent requests cannot pass it together)."""
        token = secrets.token_urlsafe(32)
        with transaction.atomic():
            get_user_model().objects.select_for_update().filter(pk=user.pk).first()
            cap = settings.LAB_MAX_TOKENS_PER_USER
            if cls.objects.filter(user=user).count() >= cap:
                raise TooManyTokens(
                    f"you have {cap} API tokens, the most a user may have (LAB_MAX_TOKENS_PER_USER); "
                    "revoke one you no longer use"
                )
            cls.objects.create(user=user, name=storable(name), digest=cls._digest(token))
        return token

    @classmethod
    def user_for(cls, token: str):
        """The active user owning `token`, or None."""
        found = (
            cls.objects.select_related("user").filter(digest=cls._digest(token), user__is_active=True).first()
        )
        if found is None:
            return None
        cls.objects.filter(pk=found.pk).update(last_used=timezone.now())
        return found.user
