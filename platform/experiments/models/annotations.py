"""What people add to runs and experiments: tags (to find and group them), notes (what they saw),
and the Runs list's saved views (a named query, shared in a team)."""

from __future__ import annotations

import re

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from accounts.models import Team

TAG_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:+-]{0,49}")
TAG_RULE = "a tag is 1 to 50 letters, digits or _ . : + -, starting with a letter or digit"


def check_tag(name: str) -> str:
    if not isinstance(name, str) or not TAG_PATTERN.fullmatch(name):
        raise ValidationError(f"{TAG_RULE} (got {str(name)[:60]!r})")
    return name


class RunTag(models.Model):
    run = models.ForeignKey("experiments.Run", on_delete=models.CASCADE, related_name="tags")
    name = models.CharField(max_length=50, validators=[check_tag])

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "name"], name="one_tag_per_run_name")]
        indexes = [models.Index(fields=["name"])]
        ordering = ["name"]


class ExperimentTag(models.Model):
    experiment = models.ForeignKey("experiments.Experiment", on_delete=models.CASCADE, related_name="tags")
    name = models.CharField(max_length=50, validators=[check_tag])

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["experiment", "name"], name="one_tag_per_experiment_name")
        ]
        indexes = [models.Index(fields=["name"])]
        ordering = ["name"]


class Note(models.Model):
    """A person's note on a run or an experiment (plain text, shown escaped)."""

    run = models.ForeignKey(
        "experiments.Run", null=True, blank=True, on_delete=models.CASCADE, related_name="user_notes"
    )
    experiment = models.ForeignKey(
        "experiments.Experiment", null=True, blank=True, on_delete=models.CASCADE, related_name="user_notes"
    )
    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="notes")
    text = models.TextField(max_length=10_000)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created", "id"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(run__isnull=False, experiment__isnull=True)
                | models.Q(run__isnull=True, experiment__isnull=False),
                name="a_note_is_on_a_run_or_an_experiment",
            )
        ]

    @classmethod
    def visible_to(cls, user) -> models.QuerySet[Note]:
        return cls.objects.filter(
            models.Q(run__experiment__team__memberships__user=user)
            | models.Q(experiment__team__memberships__user=user)
        ).select_related("run__experiment__team", "experiment__team")

    @property
    def team(self) -> Team:
        return self.run.experiment.team if self.run_id is not None else self.experiment.team

    def deletable_by(self, user) -> bool:
        """Its author may delete a note, and so may an admin of its team."""
        return self.author_id == user.pk or self.team.is_admin(user)


class SavedView(models.Model):
    """A named query of the Runs list, shared with the team."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="saved_views")
    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="saved_views")
    name = models.CharField(max_length=100)
    query = models.TextField(max_length=2000)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="one_view_name_per_team")]

    @classmethod
    def visible_to(cls, user) -> models.QuerySet[SavedView]:
        return cls.objects.filter(team__memberships__user=user)
