"""A metric summary's tail (its last TAIL finite values) as float64 bytes in place of JSON: the sink
writes one per metric on every flush, and writing floats out as text cost more than the rest of the
summary. Values move over exactly; going back writes them as JSON again."""

from django.db import migrations, models

from experiments.migrations import _packing_0018 as packing  # frozen: not the live module

BATCH = 2000


def _convert(apps, source: str, target: str, convert) -> None:
    Summary = apps.get_model("experiments", "MetricSummary")
    batch = []
    for summary in Summary.objects.only("pk", source).iterator(chunk_size=BATCH):
        setattr(summary, target, convert(getattr(summary, source)))
        batch.append(summary)
        if len(batch) >= BATCH:
            Summary.objects.bulk_update(batch, [target])
            batch = []
    Summary.objects.bulk_update(batch, [target])


def to_bytes(apps, schema_editor):
    _convert(apps, "tail", "tail_data", lambda tail: packing.pack_tail(tail or []))


def to_json(apps, schema_editor):
    _convert(apps, "tail_data", "tail", packing.unpack_tail)


class Migration(migrations.Migration):
    dependencies = [("experiments", "0018_metric_chunks")]

    operations = [
        migrations.AddField(
            model_name="metricsummary",
            name="tail_data",
            field=models.BinaryField(default=bytes),
        ),
        migrations.RunPython(to_bytes, to_json),
        migrations.RemoveField(model_name="metricsummary", name="tail"),
        migrations.RenameField(model_name="metricsummary", old_name="tail_data", new_name="tail"),
        migrations.AlterField(
            model_name="metricsummary",
            name="tail",
            field=models.BinaryField(
                default=bytes,
                help_text="the last TAIL finite values, float64 little-endian (packing.pack_tail)",
            ),
        ),
    ]
