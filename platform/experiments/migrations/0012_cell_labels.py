"""Runs' staleness labels name their cell on the staleness axis: rollout-worker runs of a schedule
are marked `(distributed)`, async runs read `async ≤ k` (they read `async,max_staleness=k`)."""

from django.db import migrations


def _schedule_label(staleness: dict) -> str:
    """A stored staleness section's label, as `StalenessConfig.label` gave it when this was written."""
    if staleness.get("offline"):
        return "offline"
    parts = []
    if staleness.get("sync_interval", 1) != 1:
        parts.append(f"sync_interval={staleness['sync_interval']}")
    if staleness.get("sync_offset", 0):
        parts.append(f"sync_offset={staleness['sync_offset']}")
    return ",".join(parts) or "on-policy"


def _labels(config: dict) -> tuple[str, str]:
    """(the label before this migration, the cell label) of a stored run config."""
    execution = config.get("execution") or {}
    mode = execution.get("mode", "simulated")
    schedule = _schedule_label(config.get("staleness") or {})
    bound = execution.get("max_staleness")
    if mode == "async":
        return f"async,max_staleness={bound}", f"async ≤ {bound}"
    return schedule, f"{schedule} (distributed)" if mode == "distributed" else schedule


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
