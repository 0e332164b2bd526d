"""Teams, memberships, invitations and API tokens move here from `experiments` as they are: their
tables keep their names (`experiments_team`, …), so only Django's state changes."""

from django.db import migrations

from lab.moves import MoveModels


class Migration(migrations.Migration):
    initial = True

    dependencies = [("experiments", "0010_checkpoints_notes_job_losses_token_names_templates")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                MoveModels("experiments", "accounts", ["Team", "Membership", "Invitation", "ApiToken"])
            ],
            database_operations=[],
        )
    ]
