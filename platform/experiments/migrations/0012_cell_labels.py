"""Runs' staleness labels name their cell on the staleness axis: rollout-worker runs of a schedule
are marked `(distributed)`, async runs read `async ≤ k` (they read `async,max_staleness=k`)."""

from django.db import migrations

from rlcore.config import StalenessConfig, cell_label


def _labels(config: dict) -> tuple[str, str]:
    """(the label before this migration, the cell label) of a stored run config."""
    execution = config.get("execution") or {}
    mode = execution.get("mode", "simulated")
    schedule = StalenessConfig.model_validate(config.get("staleness") or {}).label
    bound = execution.get("max_staleness")
    old = f"async,max_staleness={bound}" if mode == "async" else schedule
    return old, cell_label(mode, schedule, bound)


def _relabel(apps, new: bool) -> None:
    run = apps.get_model("experiments", "Run")
    for pk, config in run.objects.exclude(config__execution__mode="simulated").values_list("pk", "config"):
        old, cell = _labels(config)
        if old != cell:
            run.objects.filter(pk=pk).update(staleness=cell if new else old)


def relabel(apps, schema_editor) -> None:
    _relabel(apps, new=True)


def relabel_back(apps, schema_editor) -> None:
    _relabel(apps, new=False)


class Migration(migrations.Migration):
    dependencies = [("experiments", "0011_accounts_and_workers_move_out")]
    operations = [migrations.RunPython(relabel, relabel_back)]
