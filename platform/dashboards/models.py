"""What a team states about its results: claims (`Claim`), tested by `dashboards.claims.verdicts` against
the final values of an experiment's runs or of a selection of runs; and the reports it publishes
(`Report`, frozen as `ReportVersion`s that cite their runs through `ReportRun`)."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from accounts.models import Team
from experiments.models import Experiment, Run


class Claim(models.Model):
    """A typed statement over lines (a preset with its variant) at staleness settings, on a metric's
    final value (rule, k), with its δ and α; its verdict is computed from the runs each time it is
    read (`dashboards.claims.service.result`)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="claims")
    experiment = models.ForeignKey(
        Experiment, null=True, blank=True, on_delete=models.CASCADE, related_name="claims"
    )
    run_ids = models.JSONField(default=list, blank=True, help_text="a selection's runs, when no experiment")
    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="claims")
    title = models.CharField(max_length=300, blank=True, help_text="the claim in its author's words")
    template = models.CharField(max_length=100, blank=True, help_text="the template it was made from")
    parts = models.JSONField(help_text="[{kind, x, y}]: statements that must all hold at a setting")
    settings = models.JSONField(help_text="staleness labels it is tested at")
    quantifier = models.CharField(max_length=10, default="every")
    metric = models.CharField(max_length=100, default="eval/accuracy")
    rule = models.CharField(max_length=20, default="last")
    k = models.PositiveIntegerField(default=10)
    delta = models.FloatField(default=0.02)
    alpha = models.FloatField(default=0.05)
    stated = models.DateTimeField(auto_now_add=True)
    pre_registered = models.BooleanField(
        default=False, help_text="stated before any run of its cells had finished"
    )

    class Meta:
        ordering = ["-stated", "-id"]

    def __str__(self) -> str:
        return self.title or f"claim {self.pk}"

    @classmethod
    def visible_to(cls, user) -> models.QuerySet[Claim]:
        return cls.objects.filter(team__memberships__user=user)

    def runs(self) -> models.QuerySet[Run]:
        """Its runs, archived ones left out."""
        if self.experiment_id is not None:
            return Run.objects.filter(experiment_id=self.experiment_id, archived=None)
        return Run.objects.filter(pk__in=self.run_ids, experiment__team_id=self.team_id, archived=None)


class Report(models.Model):
    """A page of Markdown prose with blocks that embed comparison charts, summary tables and
    claims by their permalinks (`dashboards.reports.service`). The draft is `title` and `source`; each
    publication freezes it into a `ReportVersion`."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="reports")
    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="reports")
    title = models.CharField(max_length=300)
    source = models.TextField(
        blank=True, help_text="the draft: Markdown, with a block per line {{ kind link }}"
    )
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated", "-id"]

    def __str__(self) -> str:
        return f"report “{self.title}” (#{self.pk})"

    @classmethod
    def visible_to(cls, user) -> models.QuerySet[Report]:
        return cls.objects.filter(team__memberships__user=user)

    def latest(self) -> ReportVersion | None:
        return self.versions.order_by("-number").first()


class ReportVersion(models.Model):
    """A published report, frozen: its source, and each block's query, run ids and computed
    numbers and statistics (with their method, reps and seed), as they were when it was published."""

    report = models.ForeignKey(Report, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    title = models.CharField(max_length=300)
    source = models.TextField()
    blocks = models.JSONField(help_text="[{kind, link, …frozen data}] in the order they appear")
    published = models.DateTimeField(auto_now_add=True)
    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")

    class Meta:
        ordering = ["-number"]
        constraints = [models.UniqueConstraint(fields=["report", "number"], name="one_number_per_version")]

    def __str__(self) -> str:
        return f"{self.report} v{self.number}"


class ReportRun(models.Model):
    """A run a published version cites: it can be archived, never deleted, while the version stands."""

    version = models.ForeignKey(ReportVersion, on_delete=models.CASCADE, related_name="cited")
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="cited_by")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["version", "run"], name="one_citation_per_run")]

    def __str__(self) -> str:
        report = self.version.report
        return f"report “{report.title}” (#{report.pk})"
