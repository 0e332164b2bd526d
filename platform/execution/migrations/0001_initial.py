"""The worker registry moves here from `experiments` as it is: its table keeps its name
(`experiments_worker`), so only Django's state changes."""

from django.db import migrations

from lab.moves import MoveModels


class Migration(migrations.Migration):
    initial = True

    dependencies = [("experiments", "0010_checkpoints_notes_job_losses_token_names_templates")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[MoveModels("experiments", "execution", ["Worker"])], database_operations=[]
        )
    ]
