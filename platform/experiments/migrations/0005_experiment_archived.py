from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("experiments", "0004_run_phase"),
    ]

    operations = [
        migrations.AddField(
            model_name="experiment",
            name="archived",
            field=models.DateTimeField(
                blank=True, help_text="when it was hidden from the lists; empty while it is shown", null=True
            ),
        ),
    ]
