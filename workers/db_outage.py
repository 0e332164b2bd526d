"""Riding out a short database outage on a worker: `retry_db(fn)` retries an operation that is safe
to repeat for up to `LAB_DB_OUTAGE_S` while the database is unreachable, and `note_unreachable` /
`reachable_for` keep the reaper from taking the missing heartbeats of an outage for dead workers."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection

log = logging.getLogger(__name__)

FIRST_PAUSE_S = 0.1
MAX_PAUSE_S = 1.0

# What PostgreSQL being down or restarting looks like to Django.
UNREACHABLE = (OperationalError, InterfaceError)

P = ParamSpec("P")
T = TypeVar("T")

_unreachable_at: float | None = None  # time.monotonic() when this process last found it down


def note_unreachable() -> None:
    """Record that the database could not be reached just now (from any thread)."""
    global _unreachable_at
    _unreachable_at = time.monotonic()


def reachable_for(seconds: float) -> bool:
    """True unless this process found the database unreachable within the last `seconds`."""
    return _unreachable_at is None or time.monotonic() - _unreachable_at >= seconds


def retry_db(fn: Callable[P, T]) -> Callable[P, T]:
    """`fn`, retried while the database is unreachable, for up to `LAB_DB_OUTAGE_S` seconds."""

    @functools.wraps(fn)
    def retrying(*args: P.args, **kwargs: P.kwargs) -> T:
        deadline = time.monotonic() + settings.LAB_DB_OUTAGE_S
        pause = FIRST_PAUSE_S
        failures = 0
        while True:
            try:
                result = fn(*args, **kwargs)
            except UNREACHABLE as exc:
                if connection.vendor == "sqlite":
                    raise  # "database is locked" is contention, not an outage; SQLite has no server to lose
                note_unreachable()
                if connection.in_atomic_block or time.monotonic() + pause > deadline:
                    raise
                if failures == 0:
                    log.warning(
                        "%s: database unreachable (%s); retrying for up to %g s (LAB_DB_OUTAGE_S)",
                        fn.__qualname__,
                        str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
                        settings.LAB_DB_OUTAGE_S,
                    )
                failures += 1
                with contextlib.suppress(DatabaseError):
                    connection.close()  # the next attempt connects afresh
                time.sleep(pause)
                pause = min(MAX_PAUSE_S, pause * 2)
                continue
            if failures:
                log.warning("%s: database reachable again after %d retries", fn.__qualname__, failures)
            return result

    return retrying
