"""What runs report: metric points, one per (run, name, step), and example completions."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db import connection, models


class MetricPoint(models.Model):
    """One metric of one run at one trainer step.

    The unique index (run, name, step) is the only index: it leads with the run, so it serves the
    run's foreign key too. On PostgreSQL it also carries `value` and `wall_time` (a covering
    index, built by migration 0002: Django's `include` would leave SQLite with no unique index at
    all), so a comparison reads one metric of hundreds of runs from the index alone.
    """

    # No index of its own: the unique index below starts with the run.
    run = models.ForeignKey(
        "experiments.Run", on_delete=models.CASCADE, related_name="points", db_index=False
    )
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
    run = models.ForeignKey("experiments.Run", on_delete=models.CASCADE, related_name="completions")
    step = models.IntegerField()
    prompt = models.TextField()
    completion = models.TextField()
    reward = models.FloatField(null=True)

    class Meta:
        ordering = ["run", "-step", "id"]
        indexes = [models.Index(fields=["run", "step"])]

    def __str__(self) -> str:
        return f"step {self.step}: {self.prompt!r} → {self.completion!r}"
