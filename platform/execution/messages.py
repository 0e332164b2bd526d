"""Messages to workers, by task name: "execute run N, attempt A", "make rollout job J, attempt A".
The database decides and the broker only delivers, so sending is best-effort: `send` says
whether the broker took the message, and what was not sent is sent again later."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

# What a page or the API adds when work was queued but its message could not be sent.
NOT_SENT = (
    "the message broker cannot be reached right now: the work stays queued and is sent to a worker "
    "as soon as the broker is back"
)


def send(task: str, pk: int, attempt: int, queue: str) -> bool:
    """Send task `task` for attempt `attempt` of row `pk` to `queue`; False (logged) when the broker
    could not take it."""
    from lab.celery import app

    try:
        app.send_task(task, args=[pk, attempt], queue=queue)
    except Exception as exc:
        log.warning(
            "could not send %s(%s, attempt %s) to queue %s (%s: %s); it stays queued and is sent "
            "when the broker is back",
            task,
            pk,
            attempt,
            queue,
            type(exc).__name__,
            exc,
        )
        return False
    return True
