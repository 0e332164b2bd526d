"""The content types of the models that moved to `accounts` and `execution` (their 0001 migrations)
move with them, and so their permissions and the admin's log entries."""

from django.db import migrations

from lab.moves import MOVED_FROM_EXPERIMENTS as MOVED


def _move(apps, moves: dict[str, tuple[str, str]]) -> None:
    """Relabel each moved model's content type, unless its new app already has one."""
    content_type = apps.get_model("contenttypes", "ContentType")
    for model, (old, new) in moves.items():
        if not content_type.objects.filter(app_label=new, model=model).exists():
            content_type.objects.filter(app_label=old, model=model).update(app_label=new)


def move_content_types(apps, schema_editor) -> None:
    _move(apps, {model: ("experiments", app) for model, app in MOVED.items()})


def move_content_types_back(apps, schema_editor) -> None:
    _move(apps, {model: (app, "experiments") for model, app in MOVED.items()})


class Migration(migrations.Migration):
    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("accounts", "0001_initial"),
        ("execution", "0001_initial"),
        ("experiments", "0010_checkpoints_notes_job_losses_token_names_templates"),
    ]

    operations = [migrations.RunPython(move_content_types, move_content_types_back)]
