"""A worker that stalls past its heartbeat and wakes up after its run was reaped and taken by
another worker writes nothing more: no points, no seal of the run's chunks, no checkpoint hash or
file, no published weights. Compaction deletes only the parts it read, under the run's row lock,
so a seal beside a writer loses no point. A worker restarted with its old host name and PID (PID 1
of a container with a restart policy) is another worker: the run its earlier self held is reaped
and resumed from its checkpoint, not failed as "left running"."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
import torch
from django.db import connection, transaction
from django.utils import timezone
from support import PID_ONE, TINY_CONFIG, last_step, queue_sweep, summaries_disagreeing, wait_for

from experiments import series
from experiments.models import Checkpoint, MetricChunk, Run
from rlcore import checkpoints
from workers.sink import CheckpointLedger, DatabaseSink, NotOwner

pytestmark = pytest.mark.django_db(transaction=True)

START = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def _layout(run) -> list[tuple]:
    return list(
        MetricChunk.objects.filter(run=run)
        .order_by("name", "chunk", "part")
        .values_list("name", "chunk", "part", "packed", "count")
    )


def _take_over(run: Run, worker: str) -> Run:
    """The run's heartbeat went stale: reaped, re-queued as its next attempt, claimed by `worker`."""
    assert run.mark_lost(timezone.now() + timedelta(seconds=1)) and run.retry(within_cap=False)
    taken = Run.objects.get(pk=run.pk)
    assert taken.claim(worker, attempt=taken.attempt)
    return taken


def test_a_worker_that_lost_its_run_writes_nothing_when_it_wakes(run, tmp_path):
    assert run.claim("stalled:1", attempt=run.attempt)
    stalled = DatabaseSink(run, "stalled:1")
    for step in range(1, 31):
        stalled.log(step, {"loss": float(step), "reward/mean": 0.5})
    stalled.flush()

    owner_run = _take_over(run, "owner:2")
    owner = DatabaseSink(owner_run, "owner:2")
    for step in range(31, 104):
        owner.log(step, {"loss": -float(step), "reward/mean": -0.5})
    owner.flush()
    before = _layout(run)
    assert any(not packed for _, _, _, packed, _ in before), "the owner's newest chunks grow by raw parts"

    # The stalled worker wakes: what it logs, its last flush and its seal are dropped.
    for step in range(31, 41):
        stalled.log(step, {"loss": 99.0, "reward/mean": 99.0})
    stalled.close()
    assert _layout(run) == before, "a worker that lost the run sealed or wrote its chunks"
    folder = tmp_path / "checkpoints"
    with pytest.raises(NotOwner, match="no longer executed by stalled:1"):
        checkpoints.save(folder, 40, {"w": torch.ones(2)}, CheckpointLedger(run, "stalled:1"))
    assert list(folder.iterdir()) == [], "no checkpoint file (nor a temporary one) from the stalled worker"
    assert not Checkpoint.objects.filter(run=run).exists()

    for step in range(104, 301):
        owner.log(step, {"loss": -float(step), "reward/mean": -0.5})
    checkpoints.save(folder, 300, {"w": torch.ones(2)}, CheckpointLedger(owner_run, "owner:2"))
    owner.close()
    steps, values, _ = series.series(run.pk, "loss")
    assert steps.tolist() == list(range(1, 301))
    assert values.tolist() == [float(s) for s in range(1, 31)] + [-float(s) for s in range(31, 301)]
    assert not MetricChunk.objects.filter(run=run, packed=False).exists(), "the owner sealed them"
    assert list(Checkpoint.objects.filter(run=run).values_list("step", flat=True)) == [300]
    assert summaries_disagreeing([run.pk]) == []


METRICS, STEPS, PER_FLUSH = 40, 1200, 3  # 48,000 points; 400 flushes crossing a chunk boundary


def test_a_seal_beside_a_writer_loses_no_point(run):
    """The sink's writes (a `Writer` under the run's heartbeat lock) in one thread while another
    seals the run's chunks over and over: every point is there, and the summaries agree."""
    assert run.claim("writer:1", attempt=run.attempt)
    done, errors, sealed = threading.Event(), [], []

    def write() -> None:
        try:
            writer = series.Writer(run.pk)
            for first in range(1, STEPS + 1, PER_FLUSH):
                points = [
                    (f"m{i}", step, step + i / 100, START)
                    for step in range(first, first + PER_FLUSH)
                    for i in range(METRICS)
                ]
                with transaction.atomic():
                    assert run.hold("writer:1")
                    writer.write(points)
                writer.committed()
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()
            connection.close()

    def seal() -> None:
        try:
            while not done.is_set():
                sealed.append(series.seal(run.pk))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=write), threading.Thread(target=seal)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert not errors, errors
    assert sum(sealed) > 0, "the seals packed chunks while the writer wrote"
    for i in range(METRICS):
        steps, values, _ = series.series(run.pk, f"m{i}")
        assert steps.tolist() == list(range(1, STEPS + 1)), f"m{i}: {STEPS - len(steps)} points lost"
        assert np.array_equal(values, steps + i / 100)
    assert summaries_disagreeing([run.pk]) == []


def test_a_worker_restarted_with_its_old_pid_resumes_the_run_it_held(start_worker, team, alice):
    quick_reaper = {"LAB_HEARTBEAT_TIMEOUT_S": "5", "LAB_REAP_INTERVAL_S": "1"}
    held = queue_sweep(team, alice, "held", config={**TINY_CONFIG, "steps": 200, "eval_every": 20}).runs.get()
    first = start_worker(quick_reaper, prefix=PID_ONE)
    wait_for(lambda: (last_step(held, "loss") or -1) >= 5, 240, "5 steps on the first worker")
    first.kill()
    held.refresh_from_db()
    assert held.status == Run.RUNNING and held.worker == first.identity
    assert any(held.checkpoint_dir.iterdir()), "a checkpoint was written before the kill"

    after = queue_sweep(team, alice, "queued meanwhile").runs.get()  # the restarted worker's first message
    second = start_worker(quick_reaper, prefix=PID_ONE)
    assert second.identity.split(":")[:2] == first.identity.split(":")[:2], "the same host name and PID 1"
    assert second.identity != first.identity
    wait_for(
        lambda: not Run.objects.filter(pk__in=[held.pk, after.pk], status__in=Run.ACTIVE).exists(),
        300,
        "both runs to end",
    )
    held.refresh_from_db()
    assert (held.status, held.attempt, held.worker) == (Run.SUCCEEDED, 2, second.identity), held.error
    assert Run.objects.get(pk=after.pk).status == Run.SUCCEEDED
    steps, _, _ = series.series(held.pk, "loss")
    assert steps.tolist() == list(range(1, 201))
