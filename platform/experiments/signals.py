"""What experiments tell the apps above them without importing them: `run_ended(run, status,
attempt)`, sent by a run's transition that ended an attempt (succeeded, failed, lost or
cancelled), before its transaction commits; `run` is as the transition left it (a lost run may be
queued again already). Receivers must not raise (it is sent with `send_robust`)."""

from django.dispatch import Signal

run_ended = Signal()
