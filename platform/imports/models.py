"""An imported run's provenance: which tool's file it was read from (tool, version, the file's name,
size and sha256, the run's id there, its first and last logged times), who imported it and when,
the preset, staleness cell and seed it was placed at, and the metric names' mapping used. The run
itself is an ordinary `experiments.Run` (status succeeded, its points in the same chunks and
summaries as a native run's), so the comparison, the claims and the reports read it as any other;
this row is what marks it imported and read-only (`Run.is_imported`)."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from experiments.models import Experiment, Run


class Import(models.Model):
    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="imported")
    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="imports")
    tool = models.CharField(max_length=20, help_text="the source's key (imports.formats.TOOLS)")
    tool_version = models.CharField(
        max_length=100, blank=True, help_text="as the file says; blank if unknown"
    )
    original_run_id = models.CharField(
        max_length=200, blank=True, help_text="the run's id in its own tool; blank if unknown"
    )
    file_name = models.CharField(max_length=255)
    file_size = models.BigIntegerField(help_text="bytes")
    sha256 = models.CharField(
        max_length=64, help_text="of the file's bytes (a folder: of its files, by path)"
    )
    run_name = models.CharField(
        max_length=200, blank=True, help_text="the run read, in a file that holds several (a Trackio project)"
    )
    original_config = models.JSONField(default=dict, blank=True, help_text="the file's own config, as is")
    mapping = models.JSONField(
        default=dict,
        help_text="{source metric name: lab metric name} as applied; others went under imported/",
    )
    points = models.IntegerField(help_text="points imported")
    first_time = models.DateTimeField(null=True, blank=True, help_text="the earliest time the file logged")
    last_time = models.DateTimeField(null=True, blank=True, help_text="the latest time the file logged")
    imported_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    imported_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-imported_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["experiment", "sha256", "run_name"], name="one_import_per_file_run_and_experiment"
            )
        ]

    def __str__(self) -> str:
        return f"{self.file_name} ({self.tool}) → run {self.run_id}"

    @property
    def source(self) -> str:
        """The tool and its version, e.g. "prime-rl 0.3.1", as the badge names it."""
        return f"{self.tool} {self.tool_version}".strip()
