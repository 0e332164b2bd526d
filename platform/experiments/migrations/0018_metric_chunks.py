"""Metric series in chunks: one row per (run, metric, chunk of 1,024 steps) of packed steps, values
and wall times (`MetricChunk`), and a summary per (run, metric) (`MetricSummary`), in place of a
row per point (`MetricPoint`). The points already stored move into the new form, on PostgreSQL and
SQLite alike (a value stored as null, NaN or infinity when logged, becomes NaN); going back turns
the chunks into points again."""

import itertools

import django.db.models.deletion
import numpy as np
from django.db import migrations, models

from experiments.migrations import _packing_0018 as packing  # frozen: not the live module

BATCH = 2000  # rows written per INSERT


def move_points(apps, schema_editor):
    Point = apps.get_model("experiments", "MetricPoint")
    Chunk = apps.get_model("experiments", "MetricChunk")
    Summary = apps.get_model("experiments", "MetricSummary")
    rows = (
        Point.objects.order_by("run_id", "name", "step")
        .values_list("run_id", "name", "step", "value", "wall_time")
        .iterator(chunk_size=20_000)
    )
    chunks, summaries = [], []
    for (run_id, name), group in itertools.groupby(rows, key=lambda row: row[:2]):
        points = list(group)
        steps = np.array([p[2] for p in points], dtype=np.int64)
        values = np.array([np.nan if p[3] is None else p[3] for p in points], dtype=np.float64)
        times = np.array([packing.micros(p[4]) for p in points], dtype=np.int64)
        summaries.append(Summary(run_id=run_id, name=name, **packing.summarise(steps, values)))
        for chunk, part in packing.split(steps):
            chunks.append(
                Chunk(
                    run_id=run_id,
                    name=name,
                    chunk=chunk,
                    count=part.stop - part.start,
                    step_data=packing.pack_steps(chunk, steps[part]),
                    value_data=packing.pack_values(values[part]),
                    time_data=packing.pack_times(times[part]),
                )
            )
        if len(chunks) >= BATCH:
            Chunk.objects.bulk_create(chunks)
            chunks = []
        if len(summaries) >= BATCH:
            Summary.objects.bulk_create(summaries)
            summaries = []
    Chunk.objects.bulk_create(chunks)
    Summary.objects.bulk_create(summaries)


def stored_as_is(apps, schema_editor):
    """PostgreSQL would try to compress the chunks' columns again (pglz) on every write: they are
    packed already, or a growing raw chunk rewritten each flush."""
    if schema_editor.connection.vendor == "postgresql":
        for column in ("step_data", "value_data", "time_data"):
            schema_editor.execute(
                f"ALTER TABLE experiments_metricchunk ALTER COLUMN {column} SET STORAGE EXTERNAL"
            )


def move_back(apps, schema_editor):
    Point = apps.get_model("experiments", "MetricPoint")
    Chunk = apps.get_model("experiments", "MetricChunk")
    points = []
    for row in Chunk.objects.order_by("run_id", "name", "chunk", "part").iterator(chunk_size=1000):
        steps, values, times = packing.decode(
            row.chunk, row.packed, bytes(row.step_data), bytes(row.value_data), bytes(row.time_data)
        )
        for step, value, us in zip(steps.tolist(), values.tolist(), times.tolist(), strict=True):
            value = value if np.isfinite(value) else None
            points.append(
                Point(
                    run_id=row.run_id, name=row.name, step=step, value=value, wall_time=packing.wall_time(us)
                )
            )
        if len(points) >= 10 * BATCH:
            Point.objects.bulk_create(points)
            points = []
    Point.objects.bulk_create(points)


class Migration(migrations.Migration):
    dependencies = [
        ("experiments", "0017_run_archived"),
    ]

    operations = [
        migrations.CreateModel(
            name="MetricChunk",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=100)),
                ("chunk", models.BigIntegerField(help_text="the steps' step >> CHUNK_BITS")),
                (
                    "part",
                    models.IntegerField(
                        default=0,
                        help_text="0: the chunk (packed once passed); 1…: points a later flush added, raw",
                    ),
                ),
                ("count", models.IntegerField(help_text="points in the chunk")),
                (
                    "packed",
                    models.BooleanField(
                        default=True, help_text="false: raw, the series' newest chunk while it grows"
                    ),
                ),
                ("step_data", models.BinaryField()),
                ("value_data", models.BinaryField()),
                ("time_data", models.BinaryField()),
                (
                    "run",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="metric_chunks",
                        to="experiments.run",
                    ),
                ),
            ],
            options={
                "ordering": ["run", "name", "chunk", "part"],
            },
        ),
        migrations.CreateModel(
            name="MetricSummary",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=100)),
                ("count", models.IntegerField(help_text="points logged")),
                ("last_step", models.BigIntegerField()),
                (
                    "last",
                    models.FloatField(
                        help_text="the value at the last step; null if NaN or infinite", null=True
                    ),
                ),
                ("finite", models.IntegerField(help_text="points with a finite value")),
                ("first_step", models.BigIntegerField(null=True)),
                ("first", models.FloatField(help_text="the first finite value", null=True)),
                ("last_finite_step", models.BigIntegerField(null=True)),
                ("last_finite", models.FloatField(help_text="the last finite value", null=True)),
                ("min", models.FloatField(null=True)),
                ("max", models.FloatField(null=True)),
                (
                    "total",
                    models.FloatField(
                        help_text="sum of the finite values (null if it overflowed)", null=True
                    ),
                ),
                (
                    "area",
                    models.FloatField(
                        help_text="trapezoids under the finite values over their steps", null=True
                    ),
                ),
                ("tail", models.JSONField(default=list, help_text="the last TAIL finite values")),
                (
                    "run",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="metric_summaries",
                        to="experiments.run",
                    ),
                ),
            ],
            options={
                "ordering": ["run", "name"],
            },
        ),
        migrations.AddConstraint(
            model_name="metricchunk",
            constraint=models.UniqueConstraint(
                fields=("run", "name", "chunk", "part"), name="one_chunk_part_per_run_name"
            ),
        ),
        migrations.AddConstraint(
            model_name="metricsummary",
            constraint=models.UniqueConstraint(fields=("run", "name"), name="one_summary_per_run_name"),
        ),
        migrations.RunPython(stored_as_is, migrations.RunPython.noop),
        migrations.RunPython(move_points, move_back),
        migrations.DeleteModel(
            name="MetricPoint",
        ),
    ]
