"""Experiments pin their dataset files' sha256 as they pin θ0, and runs keep every attempt's
provenance. Existing data is carried over: each run's recorded provenance becomes the first entry
of its history (its attempt unknown: null), and each experiment pins the dataset files its runs'
records name, the earliest run's hash where they disagree (what its first run read)."""

from django.db import migrations, models

ROLES = {"path": "dataset_sha256", "eval_path": "eval_dataset_sha256"}


def carry_over(apps, schema_editor) -> None:
    run_model = apps.get_model("experiments", "Run")
    experiment_model = apps.get_model("experiments", "Experiment")
    pins: dict[int, dict[str, str]] = {}
    runs = run_model.objects.order_by("pk").values_list("pk", "experiment_id", "config", "provenance")
    for pk, experiment_id, config, record in runs.iterator():
        if not record:
            continue
        run_model.objects.filter(pk=pk).update(provenance_history=[{"attempt": None, "provenance": record}])
        task = (config or {}).get("task") or {}
        for field, key in ROLES.items():
            if task.get(field) and key in record:
                pins.setdefault(experiment_id, {}).setdefault(task[field], record[key])
    for experiment_id, hashes in pins.items():
        experiment_model.objects.filter(pk=experiment_id).update(dataset_hashes=hashes)


class Migration(migrations.Migration):
    dependencies = [
        ("experiments", "0019_summary_tail_binary"),
    ]

    operations = [
        migrations.AddField(
            model_name="experiment",
            name="dataset_hashes",
            field=models.JSONField(
                blank=True,
                default=dict,
                help_text="{path: sha256} of the dataset files its runs read, each pinned by the first run that read it",
            ),
        ),
        migrations.AddField(
            model_name="run",
            name="provenance_history",
            field=models.JSONField(
                blank=True,
                default=list,
                help_text="every attempt's provenance, oldest first: [{attempt, provenance}] (attempt null: "
                "recorded before attempts were told apart); the last is `provenance`",
            ),
        ),
        migrations.RunPython(carry_over, migrations.RunPython.noop),
    ]
