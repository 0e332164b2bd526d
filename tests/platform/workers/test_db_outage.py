"""`workers.db_outage.retry_db`: a database call whose connection PostgreSQL dropped is made again
on a fresh connection; it gives up after `LAB_DB_OUTAGE_S`, and never retries half-way through a
transaction. (The outage of a whole server, with real workers, is tests/platform/workers/test_chaos_database.py.)"""

from __future__ import annotations

import psycopg
import pytest
from django.db import OperationalError, connection, transaction
from django.test import override_settings
from support import queue_sweep

from experiments.models import Run
from workers import db_outage, tasks
from workers.db_outage import reachable_for, retry_db

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL: the test drops its own connection with pg_terminate_backend")
    yield
    connection.close()  # a connection the test left dropped: the teardown connects afresh


def drop_this_connection() -> None:
    """Have PostgreSQL end this thread's Django connection, as a server restart would."""
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    s = connection.settings_dict
    with psycopg.connect(
        host=s["HOST"], port=s["PORT"] or 5432, user=s["USER"], password=s["PASSWORD"], dbname=s["NAME"]
    ) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)


def count_runs() -> int:
    return Run.objects.count()


def test_a_call_on_a_dropped_connection_is_made_again_on_a_fresh_one(postgres_only, team):
    drop_this_connection()
    with pytest.raises(OperationalError):
        count_runs()  # what a worker's call met before
    connection.close()

    drop_this_connection()
    assert retry_db(count_runs)() == 0
    assert not reachable_for(60), "the reaper is told the database was unreachable just now"


def test_it_gives_up_after_LAB_DB_OUTAGE_S(postgres_only, team):
    calls = []

    def always_dropped() -> int:
        calls.append(1)
        drop_this_connection()
        return count_runs()

    with override_settings(LAB_DB_OUTAGE_S=0.5), pytest.raises(OperationalError):
        retry_db(always_dropped)()
    assert len(calls) > 1


def test_nothing_is_retried_inside_a_transaction(postgres_only, team):
    calls = []

    def dropped_once() -> int:
        calls.append(1)
        if len(calls) == 1:
            drop_this_connection()
        return count_runs()

    with pytest.raises(OperationalError), transaction.atomic():
        retry_db(dropped_once)()
    assert len(calls) == 1
    connection.close()
    assert retry_db(dropped_once)() == 0 and len(calls) == 2


def test_reachable_for_counts_from_the_last_failure(monkeypatch):
    monkeypatch.setattr(db_outage, "_unreachable_at", None)
    assert reachable_for(3600)
    db_outage.note_unreachable()
    assert not reachable_for(3600) and reachable_for(0)


def test_a_claim_whose_answer_was_lost_is_taken_back_not_doubled(postgres_only, team, alice):
    """The database drops between a claim's commit and its answer: the retried claim finds the run
    this worker already holds and executes it, instead of claiming the next one and leaving the
    first claimed without a heartbeat (the reaper would take an attempt from it)."""
    experiment = queue_sweep(team, alice, "claims", presets=["grpo", "reinforce"])
    first, second = experiment.runs.order_by("id")
    worker = "host:1234"
    assert Run.claim_next(first.queue, worker).pk == first.pk  # committed; its answer "lost"

    drop_this_connection()
    assert tasks.claim(second.pk, worker).pk == first.pk
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.status, first.attempt, second.status) == (Run.RUNNING, 1, Run.QUEUED)
