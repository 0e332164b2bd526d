"""Metric points: one index, the unique (run, name, step), covering value and wall time on PostgreSQL.

The run's own foreign-key index goes (the unique index leads with the run). On PostgreSQL the
unique constraint is rebuilt with INCLUDE (value, wall_time), so the comparison dashboard reads
a metric of hundreds of runs by an index-only scan. That is SQL here rather than Django's
`UniqueConstraint(include=…)`, which SQLite would skip altogether, leaving it no unique index for
the worker's upserts.
"""

import django.db.models.deletion
from django.db import migrations, models

TABLE = "experiments_metricpoint"
NAME = "one_point_per_run_name_step"


def covering(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE {TABLE} DROP CONSTRAINT {NAME}")
        schema_editor.execute(
            f"ALTER TABLE {TABLE} ADD CONSTRAINT {NAME} UNIQUE (run_id, name, step) INCLUDE (value, wall_time)"
        )


def plain(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE {TABLE} DROP CONSTRAINT {NAME}")
        schema_editor.execute(f"ALTER TABLE {TABLE} ADD CONSTRAINT {NAME} UNIQUE (run_id, name, step)")


class Migration(migrations.Migration):
    dependencies = [
        ("experiments", "0001_initial"),
    ]

    operations = [
        migrations.AlterField(
            model_name="metricpoint",
            name="run",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="points",
                to="experiments.run",
            ),
        ),
        migrations.RunPython(covering, plain),
    ]
