"""What was asked and what came of it: an experiment (one submitted sweep), its runs (their fields
and what they read; their lifecycle, `queued → running → succeeded | failed | cancelled` plus
`lost`, is the `lifecycle` mixin's, and whose turn it is the `turns` mixin's), and the sweeps a
team saved to start from."""

from __future__ import annotations

import contextlib
import shutil
import uuid
from pathlib import Path

from django.conf import settings
from django.db import models, transaction
from django.db.models import Count
from django.db.models.signals import post_delete
from django.dispatch import receiver
from django.utils import timezone
from pydantic import ValidationError

from accounts.models import Team
from execution.leases import Leased
from execution.models import needed_queues
from experiments.collapse import METRIC as COLLAPSE_METRIC
from experiments.collapse import Collapse, find_collapse
from experiments.models.jobs import RolloutJob
from experiments.models.lifecycle import Lifecycle
from experiments.models.results import Completion, MetricChunk, MetricSummary
from experiments.models.turns import TakingTurns
from experiments.packing import finite_or_none
from experiments.text import variant_label
from rlcore.config import RunConfig
from rlcore.sinks import SUMMARY_LATEST, Measured


def validation_context() -> dict[str, list[str]]:
    """What `RunConfig` validation needs beyond the config: the folders runs may read from."""
    return {"data_roots": settings.LAB_DATA_ROOTS, "model_roots": settings.LAB_MODEL_ROOTS}


class Theta0Mismatch(ValueError):
    """A worker loaded other initial weights than the experiment's other runs started from."""


class DatasetMismatch(ValueError):
    """A worker found other bytes in a dataset file than the experiment's runs read before."""


class ExperimentNotDeletable(Exception):
    """An experiment cannot be deleted while any of its runs is queued or running, nor while a
    published report cites one of them (archive those instead)."""


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
    dataset_hashes = models.JSONField(
        default=dict,
        blank=True,
        help_text="{path: sha256} of the dataset files its runs read, each pinned by the first run that read it",
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

    def dataset_refusal(self, found: dict[str, str]) -> str:
        """Why a run that read dataset files with the sha256 `found` ({path: sha256}) may not go
        on in this experiment ("" if it may): one whose bytes differ from those its runs read."""
        for path, sha256 in found.items():
            pinned = self.dataset_hashes.get(path, sha256)
            if pinned != sha256:
                return (
                    f"dataset {path} has changed since this experiment's runs read it: they read sha256 "
                    f"{pinned}, this worker found {sha256}. One experiment never mixes dataset versions: "
                    "restore the file to go on, or start a new sweep to train on it as it is now"
                )
        return ""

    def pin(self, theta0: str, datasets: dict[str, str]) -> None:
        """Pin θ0 and the dataset files (`{path: sha256}`) not pinned yet; raise `DatasetMismatch`
        or `Theta0Mismatch` (nothing pinned) when one differs from its pin. Under the row's lock."""
        with transaction.atomic():
            pinned = Experiment.objects.select_for_update().get(pk=self.pk)
            refusal = pinned.dataset_refusal(datasets)
            if refusal:
                raise DatasetMismatch(refusal)
            if pinned.theta0_sha256 not in ("", theta0):
                raise Theta0Mismatch(
                    f"this worker loaded θ0 {theta0}, but experiment {self.pk} is pinned to θ0 "
                    f"{pinned.theta0_sha256}: its runs must all start from the same weights (a different "
                    "model cache or model files on this worker?)"
                )
            pinned.theta0_sha256 = theta0
            pinned.dataset_hashes = {**datasets, **pinned.dataset_hashes}
            pinned.save(update_fields=["theta0_sha256", "dataset_hashes"])
        self.theta0_sha256, self.dataset_hashes = pinned.theta0_sha256, pinned.dataset_hashes

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
            "points": sum(MetricSummary.objects.filter(run__experiment=self).values_list("count", flat=True)),
            "completions": Completion.objects.filter(run__experiment=self).count(),
        }

    def delete_with_files(self) -> None:
        """Delete the experiment, its runs and all they logged, then, once that has committed,
        the runs' folders under `LAB_RUNS_DIR` (checkpoints, buffers: `remove_run_folder`).

        Raises `ExperimentNotDeletable` while a run is queued or running (a worker would go on
        writing), and while a published report cites one of its runs, naming the reports.
        The runs stay locked until the delete commits, so none is retried in between.
        """
        with transaction.atomic():
            runs = list(Run.objects.select_for_update().filter(experiment=self))
            active = sum(run.is_active for run in runs)
            if active:
                raise ExperimentNotDeletable(
                    f"{self.name} has {active} queued or running run{'s' if active != 1 else ''}; "
                    "cancel it first, then delete it once they have stopped"
                )
            try:
                self.delete()
            except models.ProtectedError as exc:
                citing = sorted({str(obj) for obj in exc.protected_objects})
                raise ExperimentNotDeletable(
                    f"{self.name} has runs that {', '.join(citing[:5])} cite"
                    f"{' and more' if len(citing) > 5 else ''}; archive the runs instead"
                ) from exc


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


class Run(TakingTurns, Lifecycle, Leased):
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
    TASK = "workers.tasks.execute_run"

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="runs")
    key = models.UUIDField(
        default=uuid.uuid4, unique=True, editable=False, help_text="names its checkpoint folder"
    )
    config = models.JSONField(help_text="the fully resolved RunConfig")
    preset = models.CharField(max_length=100)
    staleness = models.CharField(max_length=100)
    variant_pairs = models.JSONField(
        default=list,
        blank=True,
        help_text="its values of the sweep's other axes, [[config field, value], …] in the sweep's order",
    )
    seed = models.IntegerField()
    serial = models.BooleanField(
        default=False,
        help_text="measured alone: starts on an idle pool, and nothing else starts while it runs",
    )
    queue = models.CharField(max_length=20, default="cpu")
    status = models.CharField(max_length=20, choices=STATUSES, default=QUEUED, db_index=True)
    cancel_requested = models.DateTimeField(null=True, blank=True)
    progress = models.IntegerField(default=0, help_text="last trainer step reported")
    phase = models.CharField(
        max_length=20, blank=True, help_text="what the running attempt is doing (rlcore.sinks.PHASES)"
    )
    phase_detail = models.JSONField(
        default=dict, blank=True, help_text="the phase's numbers, and when training steps were done"
    )
    summary = models.JSONField(default=dict, blank=True)
    provenance = models.JSONField(
        default=dict,
        blank=True,
        help_text="θ0 and dataset hashes, versions, device, host (rlcore.provenance)",
    )
    provenance_history = models.JSONField(
        default=list,
        blank=True,
        help_text="every attempt's provenance, oldest first: [{attempt, provenance}] (attempt null: "
        "recorded before attempts were told apart); the last is `provenance`",
    )
    notes = models.JSONField(
        default=list,
        blank=True,
        help_text="what its workers had to work around (a damaged checkpoint passed over, …): "
        "[{at, attempt, text}]",
    )
    created = models.DateTimeField(auto_now_add=True)
    archived = models.DateTimeField(
        null=True,
        blank=True,
        help_text="when it was set aside: kept, but out of the lists, comparisons and claims",
    )

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.preset}, {self.staleness}, seed {self.seed})"

    @classmethod
    def visible_to(cls, user) -> models.QuerySet[Run]:
        return cls.objects.filter(experiment__team__memberships__user=user)

    @classmethod
    def create_for(cls, experiment: Experiment, config, **fields) -> Run:
        """A run of `experiment` for a validated `rlcore.config.RunConfig`, labelled from it
        (`variant`: its values of the sweep's other axes)."""
        fields["variant_pairs"] = [[name, value] for name, value in fields.pop("variant", {}).items()]
        return cls.objects.create(
            experiment=experiment,
            config=config.model_dump(mode="json"),
            preset=config.algorithm.preset,
            staleness=config.staleness_label,
            seed=config.seed,
            queue=config.queue,
            **fields,
        )

    @property
    def is_imported(self) -> bool:
        """Read from another tool's file (`imports.models.Import`, its provenance): read-only, so
        never queued, cancelled or retried."""
        return hasattr(self, "imported")

    def read_only_refusal(self, action: str) -> str:
        """Why `action` ("retried", "cancelled") is refused as this run is imported ("" if it is not)."""
        if not self.is_imported:
            return ""
        return (
            f"run {self.pk} was imported from {self.imported.source} ({self.imported.file_name}) and is "
            f"read-only: it cannot be {action}"
        )

    @property
    def variant(self) -> dict:
        """Its values of the sweep's other axes (config field → value), in the sweep's order."""
        return dict(self.variant_pairs)

    @property
    def variant_label(self) -> str:
        """Its values of the sweep's other axes, e.g. "minibatches=4, dtype=bfloat16" ("" if none)."""
        return variant_label(self.variant)

    @property
    def line(self) -> str:
        """Its line within its experiment: the preset, with its values of the sweep's other axes."""
        return f"{self.preset} · {self.variant_label}" if self.variant else self.preset

    def datasets_read(self, record: dict) -> dict[str, str]:
        """{path: sha256} of the dataset files a provenance `record` of this run names."""
        task = self.config.get("task", {})
        roles = {"path": "dataset_sha256", "eval_path": "eval_dataset_sha256"}
        return {task[field]: record[key] for field, key in roles.items() if task.get(field) and key in record}

    def check_datasets(self, found: dict[str, str]) -> None:
        """Before the worker loads anything: raise `DatasetMismatch` when a dataset file it found
        (`{path: sha256}`) differs from what the experiment's runs read (nothing is pinned here:
        a run pins only once it has read the file and loaded θ0, `record_provenance`)."""
        refusal = Experiment.objects.get(pk=self.experiment_id).dataset_refusal(found)
        if refusal:
            raise DatasetMismatch(refusal)

    @property
    def provenance_changes(self) -> list[dict]:
        """The earlier attempts' provenance as it differs from the newest's, newest first:
        [{attempt, changed: {key: that attempt's value}}] ([] with one attempt or none)."""
        if len(self.provenance_history) < 2:
            return []
        newest = self.provenance_history[-1]["provenance"]
        return [
            {
                "attempt": entry["attempt"],
                "changed": {
                    key: entry["provenance"].get(key)
                    for key in sorted(entry["provenance"].keys() | newest.keys())
                    if entry["provenance"].get(key) != newest.get(key)
                },
            }
            for entry in reversed(self.provenance_history[:-1])
        ]

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
    def tensorboard_dir(self) -> Path:
        """Where the run's points are mirrored as TensorBoard event files (`imports.mirror`);
        kept when it succeeds (only its checkpoints go)."""
        return settings.LAB_RUNS_DIR / str(self.key) / "tensorboard"

    def remove_checkpoints(self) -> None:
        """The run succeeded: it is never retried, so nothing will resume from its checkpoints,
        and they go (rejected ones too), with its folder once nothing else is left in it. Their
        sha256 stay in the ledger, as those of checkpoints rotated out do."""
        shutil.rmtree(self.checkpoint_dir, ignore_errors=True)
        with contextlib.suppress(OSError):  # its buffer is still there, or the folder is gone
            self.checkpoint_dir.parent.rmdir()

    @property
    def is_active(self) -> bool:
        return self.status in Run.ACTIVE

    @property
    def ended_early(self) -> bool:
        """Failed, cancelled or lost before its last step was stored (`progress`, beaten in the
        transaction that stores the points, is below its configured steps): its last values are an
        earlier step's, so no comparison, statistic, speed-up or claim counts it as a finished seed.
        A run whose steps were all stored counts whatever its status (e.g. failed afterwards, while
        storing its measurement): its final values are those of a complete run."""
        return self.status in Run.RETRYABLE and self.progress < self.steps

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
        steps, values, _ = MetricChunk.series(self.pk, COLLAPSE_METRIC)
        return find_collapse(
            (step, finite_or_none(value)) for step, value in zip(steps.tolist(), values.tolist(), strict=True)
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
        logged = {s.name: s for s in MetricSummary.objects.filter(run=self)}
        if not logged:
            return {}
        last_step = max(s.last_step for s in logged.values())
        accuracy_steps, accuracy, _ = MetricChunk.series(self.pk, "eval/accuracy")
        initial = accuracy[accuracy_steps == 0]
        summary: dict[str, float | None] = {
            "steps": float(last_step),
            "completed": float(last_step == self.steps),
            "eval/accuracy_initial": finite_or_none(initial[0]) if len(initial) else None,
        }
        for name in SUMMARY_LATEST:
            if name in logged:
                summary[name] = logged[name].last
        return {**summary, **self.collapse_summary()}

    @property
    def execution_mode(self) -> str:
        """simulated, distributed or async; runs stored before execution modes existed were simulated."""
        return self.config.get("execution", {}).get("mode", "simulated")

    @property
    def measured(self) -> Measured:
        """What its worker measured of its last attempt (`rlcore.sinks.Measured`), from its summary."""
        return Measured.of(self.summary)

    @property
    def execution_report(self) -> Measured | None:
        """What a finished distributed or async run reported about its execution (`Measured`'s
        weights_publish_s_mean and weights_publish_bytes, the mean seconds to publish the weights
        and the bytes published in all; idle_trainer_frac and idle_rollout_frac, the fractions of
        wall time the trainer and the rollout workers were idle). None for simulated runs and runs
        that have not finished."""
        measured = self.measured
        reported = (
            measured.weights_publish_s_mean,
            measured.weights_publish_bytes,
            measured.idle_trainer_frac,
            measured.idle_rollout_frac,
        )
        if self.execution_mode == "simulated" or None in reported:
            return None
        return measured

    @property
    def needed_queues(self) -> list[str]:
        """The queues this run's jobs go to: its training queue, and its rollout queue if it has one.
        A stored config today's rules refuse (stored before a bound was added: its run fails with
        the reason when it starts) still shows, with its training queue."""
        try:
            return needed_queues([RunConfig.model_validate(self.config)])
        except ValidationError:
            return [self.queue]

    def rollout_job_counts(self) -> dict[str, int]:
        """How many of the run's rollout jobs are in each status: every status, in lifecycle order."""
        found = dict(self.rollout_jobs.order_by().values_list("status").annotate(n=Count("id")))
        return {status: found.get(status, 0) for status, _ in RolloutJob.STATUSES}

    def latest_rollout_jobs(self, limit: int) -> list[RolloutJob]:
        """The run's last `limit` rollout jobs: newest step first, parts in order within a step."""
        return list(self.rollout_jobs.order_by("-step", "kind", "part")[:limit])

    @property
    def buffer_dir(self) -> Path:
        """Published weights and generated batches of distributed and async execution."""
        return settings.LAB_RUNS_DIR / str(self.key) / "buffer"


@receiver(post_delete, sender=Run)
def remove_run_folder(sender: type[Run], instance: Run, **kwargs) -> None:
    """However a run is deleted (with its experiment, in the admin, with its team), its folder under
    `LAB_RUNS_DIR` (checkpoints, buffer) goes once the deletion has committed."""
    folder = instance.checkpoint_dir.parent
    transaction.on_commit(lambda: shutil.rmtree(folder, ignore_errors=True))
