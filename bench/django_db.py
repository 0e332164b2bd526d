"""What the benchmarks that time the web tier share: Django set up from this checkout on the
database of `DATABASE_URL`, a throwaway test database around the measurements, and two cores."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def two_cores() -> None:
    """Measure as on the 2-core machines the numbers are stated for."""
    if len(os.sched_getaffinity(0)) > 2:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])


def setup_django() -> None:
    os.environ.setdefault("LAB_VAR_DIR", str(ROOT / "var" / "bench"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lab.settings")
    sys.path[:0] = [str(ROOT), str(ROOT / "platform")]
    import django

    django.setup()


@contextmanager
def test_database() -> Iterator:
    """A fresh test database for the block (the connection to it), destroyed after."""
    from django.db import connection
    from django.test.utils import setup_test_environment, teardown_test_environment

    setup_test_environment()
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        yield connection
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)
        teardown_test_environment()
