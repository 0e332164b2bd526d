"""`python manage.py reap`: take back the runs and rollout jobs whose worker stopped heartbeating
(`experiments.reaping`: lost, re-queued while they have attempts left), then send the messages of
queued work that may be missing (`experiments.dispatch`), once.

Workers do both by themselves (every LAB_REAP_INTERVAL_S and LAB_DISPATCH_INTERVAL_S); the
command is for when none runs, or to check by hand.
"""

from django.core.management.base import BaseCommand

from experiments import dispatch, reaping


class Command(BaseCommand):
    help = (
        "Mark runs and rollout jobs whose worker stopped heartbeating as lost; re-queue those with "
        "attempts left; send the messages of queued work that may be missing."
    )

    def handle(self, *args, **options):
        reaped = reaping.reap()
        for what, row in reaped.each():
            self.stdout.write(f"{what}: lost, now {row.status} (attempt {row.attempt})")
        self.stdout.write(f"{len(reaped.runs)} lost run(s)")
        self.stdout.write(f"{len(reaped.jobs)} lost rollout job(s)")
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
