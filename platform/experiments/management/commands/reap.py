"""`python manage.py reap`: mark runs with stale heartbeats lost and re-queue them, then send the
messages of queued work that may be missing (`experiments.dispatch`), once.

Workers do both by themselves (every LAB_REAP_INTERVAL_S and LAB_DISPATCH_INTERVAL_S); the
command is for when none runs, or to check by hand.
"""

from django.core.management.base import BaseCommand

from experiments import dispatch
from experiments.models import Run


class Command(BaseCommand):
    help = (
        "Mark runs whose worker stopped heartbeating as lost; re-queue those with attempts left; "
        "send the messages of queued work that may be missing."
    )

    def handle(self, *args, **options):
        reaped = Run.reap()
        for run in reaped:
            self.stdout.write(f"run {run.pk}: lost, now {run.status} (attempt {run.attempt})")
        self.stdout.write(f"{len(reaped)} lost run(s)")
        try:
            sent = dispatch.dispatch()
        except Exception as exc:
            self.stderr.write(
                f"could not reach the message broker ({type(exc).__name__}: {exc}); nothing re-sent"
            )
            return
        for what in sent:
            self.stdout.write(f"re-sent the message of {what}")
        self.stdout.write(f"{len(sent)} message(s) re-sent")
