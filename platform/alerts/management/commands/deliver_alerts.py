"""`python manage.py deliver_alerts`: try every team alert that is due, once (`alerts.deliver`).

Workers do this by themselves every LAB_ALERTS_INTERVAL_S; the command is for when none runs,
or to check by hand (the team page's delivery log, or its output, says how each try went).
"""

from django.core.management.base import BaseCommand

from alerts.deliver import deliver_due


class Command(BaseCommand):
    help = "Try every team alert that is due once; retries and giving up as the workers do (docs/alerts.md)."

    def handle(self, *args, **options):
        self.stdout.write(f"{deliver_due()} delivery attempt(s)")
