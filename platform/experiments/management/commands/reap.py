"""`python manage.py reap`: mark runs with stale heartbeats lost and re-queue them, once.

Workers do this by themselves every LAB_REAP_INTERVAL_S; the command is for when none runs.
"""

from django.core.management.base import BaseCommand

from experiments.models import Run


class Command(BaseCommand):
    help = "Mark runs whose worker stopped heartbeating as lost; re-queue those with attempts left."

    def handle(self, *args, **options):
        reaped = Run.reap()
        for run in reaped:
            self.stdout.write(f"run {run.pk}: lost, now {run.status} (attempt {run.attempt})")
        self.stdout.write(f"{len(reaped)} lost run(s)")
