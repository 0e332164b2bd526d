"""The Celery tasks by name: execute a run (the training job: claim the next queued run of the
queue, train it with a `DatabaseSink` and, in distributed and async execution, a `DatabaseSource`,
under its memory ceiling, or in `execution.train_processes` torchrun ranks (`workers.ranks`),
and end it), make rollout jobs (`workers.rollout`), and the reaper, dispatcher and alerts
threads every worker runs (docs/architecture.md, "A run's lifecycle"; docs/alerts.md)."""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import secrets
import threading
import time

from celery.signals import worker_init, worker_ready
from django.conf import settings
from django.db import close_old_connections, connection, transaction

from execution.models import Worker
from experiments import dispatch, packing, reaping
from experiments.models import RolloutJob, Run
from imports import mirror as mirrors
from lab.celery import app
from workers.buffer import clear_buffer
from workers.db_outage import UNREACHABLE, note_unreachable, reachable_for, retry_db
from workers.memory import MemoryCeiling, OverMemoryCeiling, import_model_libraries
from workers.ranks import RankKilled
from workers.sink import CheckpointLedger, DatabaseSink, measurement, note_mirror
from workers.source import BufferDamaged, DatabaseSource

log = logging.getLogger(__name__)


# Drawn once per process start: a worker restarted with its old host name and PID (PID 1 of a
# container with a restart policy) is another worker, so the runs its earlier self held are
# reaped and resumed from their checkpoints, not failed as left running by this process.
_STARTED = secrets.token_hex(4)


def worker_identity() -> str:
    """host:pid:start, unique to this process's start."""
    return f"{platform.node()}:{os.getpid()}:{_STARTED}"


def execute(run_id: int, attempt: int) -> str:
    """Execute the next queued run of run `run_id`'s queue (often that run itself: a message
    says "a run of this queue is waiting", the database says which goes first); return what
    happened. Nothing to do when that queue has no queued run that may start.

    Whatever goes wrong once a run is claimed, training or after it (storing its last points,
    its summary), ends the run `failed` with the reason: a run is never left `running` by a task
    that raised."""
    worker = worker_identity()
    retry_db(fail_left_running)(worker)
    run = claim(run_id, worker)
    if run is None:
        return f"run {run_id} attempt {attempt}: not queued any more, nothing to do"
    log.info("run %s attempt %s: claimed by %s", run.pk, run.attempt, worker)
    try:
        return _train(run, worker)
    except Exception as exc:  # not the training's own failure (that is handled in `_train`)
        log.exception("run %s attempt %s: failed after training", run.pk, run.attempt)
        if not retry_db(run.fail)(worker, f"{type(exc).__name__}: {exc}"):
            return f"run {run.pk} attempt {run.attempt}: no longer this worker's"
        retry_db(RolloutJob.cancel_for)(run)
        return f"run {run.pk} attempt {run.attempt}: failed"


def _processes(run: Run) -> int:
    """The run's trainer processes (1 where its config does not load: `_train` reports that)."""
    try:
        return run.run_config().execution.train_processes
    except Exception:
        return 1


def _train(run: Run, worker: str) -> str:
    if (processes := _processes(run)) > 1:
        return _train_in_ranks(run, worker, processes)
    run_id, attempt = run.pk, run.attempt
    sink = DatabaseSink(run, worker)
    reporting, mirror = mirrors.reporting(run, sink)  # `sink` alone unless the run is mirrored
    source = None
    try:
        config = run.run_config()
        import_model_libraries()  # every run loads them: imported before the run's memory is measured
        from rlcore.models import resolve_device
        from rlcore.tasks import dataset_sha256s
        from rlcore.trainer import train

        # Dataset files edited since the experiment's runs read them are refused before θ0 is
        # loaded (a warm start can be long); `Run.record_provenance` checks what was read again.
        retry_db(run.check_datasets)(dataset_sha256s(config.task))
        if config.execution.mode != "simulated":
            source = DatabaseSource(run, config, sink.should_stop, worker)
        ceiling = MemoryCeiling(
            settings.LAB_RUN_MEMORY_MB, limit_address_space=resolve_device(config.device).type == "cpu"
        )
        summary = ceiling.call(
            train,
            config,
            reporting,
            checkpoint_dir=run.checkpoint_dir,
            cache_dir=settings.LAB_CACHE_DIR,
            source=source,
            ledger=CheckpointLedger(run, worker),
        )
        sink.measurement.stop()  # what follows is storing, not training
        if source is not None:
            summary.update(source.summary())
        sink.close()
    except Exception as exc:
        log.exception("run %s attempt %s failed", run_id, attempt)
        over_memory = isinstance(exc, OverMemoryCeiling)
        if over_memory:
            connection.close()  # the interruption may have cut a query short: reconnect afresh
        try:
            sink.close()  # what it logged before it failed, for the summary below
        except Exception:
            log.exception("run %s: the points still buffered could not be stored", run_id)
        note_mirror(run, worker, mirror, succeeded=False)
        # Over its memory ceiling: failed with the reason, never re-queued (only a manual retry).
        # The summary is what it logged before it failed (`Run.summary_from_points`).
        execution = None
        if source is not None:
            try:
                execution = source.summary()
            except Exception:
                log.exception("run %s: no execution report for the failed attempt", run_id)
        reason = str(exc) if over_memory else f"{type(exc).__name__}: {exc}"
        return _failed(run, worker, exc, reason, execution)
    summary.update(measurement(run, sink, worker))
    note_mirror(run, worker, mirror, succeeded=True)
    return _finished(run, worker, summary)


def _train_in_ranks(run: Run, worker: str, processes: int) -> str:
    """`_train` for a run of `processes` trainer ranks (`workers.ranks`): rank 0 reports and
    measures; this process waits, watches for a cancel, and ends the run."""
    from workers import ranks

    try:
        summary = ranks.train(run, worker, processes)
    except Exception as exc:
        log.exception("run %s attempt %s failed", run.pk, run.attempt)
        execution = getattr(exc, "execution", None)  # rank 0's batch source's report, if it left one
        return _failed(run, worker, exc, f"{type(exc).__name__}: {exc}", execution)
    return _finished(run, worker, summary)


def _failed(run: Run, worker: str, exc: Exception, reason: str, execution: dict | None) -> str:
    run_id, attempt = run.pk, run.attempt
    # Not the run's fault (a rank killed from outside is a lost worker's), and a new attempt can
    # go on: from a checkpoint.
    requeue = isinstance(exc, BufferDamaged | RankKilled) and attempt < settings.LAB_MAX_ATTEMPTS

    def end_attempt() -> bool:
        # One transaction: nobody sees a run that is re-queued as failed in between (a page, a
        # sweep's "finished", a script waiting for the run to end).
        with transaction.atomic():
            if not run.fail(worker, reason, execution):
                return False
            RolloutJob.cancel_for(run)
            if requeue:
                run.retry(within_cap=False)
            return True

    if not retry_db(end_attempt)():
        # Reaped while it stalled and taken by another worker (or ended meanwhile): its rollout
        # jobs and its next attempt are the new owner's business.
        log.warning("run %s attempt %s: no longer this worker's; nothing recorded", run_id, attempt)
        return f"run {run_id} attempt {attempt}: no longer this worker's"
    if requeue:
        return f"run {run_id} attempt {attempt}: failed; re-queued as attempt {run.attempt}"
    return f"run {run_id} attempt {attempt}: failed"


def _finished(run: Run, worker: str, summary: dict) -> str:
    run_id, attempt = run.pk, run.attempt
    finished = retry_db(run.finish)(
        worker, {name: packing.finite_or_none(value) for name, value in summary.items()}
    )
    if not finished:
        return f"run {run_id} attempt {attempt}: no longer this worker's"
    if run.status in (Run.SUCCEEDED, Run.CANCELLED):
        retry_db(RolloutJob.cancel_for)(run)
        clear_buffer(run)
    if run.status == Run.SUCCEEDED:
        run.remove_checkpoints()  # a cancelled run keeps them: a retry resumes from them
    return f"run {run_id} attempt {attempt}: {run.status}"


LEFT_RUNNING = (
    "the worker's earlier execution of this run ended without finishing it (see the worker's log); "
    "it is not executed again by the same worker"
)


def fail_left_running(worker: str) -> list[Run]:
    """Fail the runs still `running` under this worker's name before it claims another: a worker
    executes one run at a time, so such a run is left over from an execution of this process
    that ended without finishing it. Another message must not execute it again (that was a loop:
    every later message re-claimed it). Returns them."""
    left = list(Run.objects.filter(status=Run.RUNNING, worker=worker))
    for run in left:
        log.error("run %s attempt %s: %s", run.pk, run.attempt, LEFT_RUNNING)
        if run.fail(worker, LEFT_RUNNING):
            RolloutJob.cancel_for(run)
    return left


@retry_db
def claim(run_id: int, worker: str) -> Run | None:
    """The next queued run of run `run_id`'s queue, claimed by `worker`; None if there is none.

    A run already running under this worker's name comes first: `execute` failed those left over
    before it called this, so that is a claim whose UPDATE committed but whose answer the
    database dropped (an outage between the two: this is `retry_db`'s retry). Claiming another
    would leave that one claimed, without a heartbeat, until the reaper took an attempt from it."""
    held = Run.objects.filter(status=Run.RUNNING, worker=worker).order_by("id").first()
    if held is not None:
        log.warning("run %s attempt %s: already claimed by this worker; executing it", held.pk, held.attempt)
        return held
    hint = Run.objects.filter(pk=run_id).first()
    return Run.claim_next(hint.queue, worker) if hint is not None else None


@app.task(name="workers.tasks.execute_run", acks_late=True, reject_on_worker_lost=True)
def execute_run(run_id: int, attempt: int) -> str:
    return execute(run_id, attempt)


@app.task(name="workers.tasks.generate_batch", acks_late=True, reject_on_worker_lost=True)
def generate_batch(job_id: int, attempt: int) -> str:
    from workers import rollout

    return rollout.generate(job_id, attempt, worker_identity())


def device_precisions() -> list[str]:
    """The lower rollout precisions this worker's device runs (`rollout.dtype`): each one a small
    matrix product there succeeds in (bfloat16 on a GPU only where CUDA says it supports it)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = []
    for name in ("bfloat16", "float16"):
        dtype = getattr(torch, name)
        if device == "cuda" and name == "bfloat16" and not torch.cuda.is_bf16_supported():
            continue
        try:
            ones = torch.ones(4, 4, dtype=dtype, device=device)
            float((ones @ ones).sum())
        except (RuntimeError, TypeError):
            continue
        out.append(name)
    return out


def device_counts() -> tuple[int, int]:
    """The CPU cores this worker may run on and the GPUs it sees: at most that many trainer
    processes of a run (`execution.train_processes`) on each."""
    import torch

    from rlcore.launch import usable_cores

    return usable_cores(), torch.cuda.device_count() if torch.cuda.is_available() else 0


def reap_forever(interval_s: float, queues: list[str]) -> None:
    identity = worker_identity()
    precisions = device_precisions()
    cores, gpus = device_counts()
    while True:
        try:
            Worker.seen(identity, queues, precisions, cores, gpus)
        except Exception as exc:
            log.exception("recording this worker's heartbeat failed; trying again in %.0f s", interval_s)
            if isinstance(exc, UNREACHABLE):
                note_unreachable()
        time.sleep(interval_s)
        try:
            if not reachable_for(settings.LAB_HEARTBEAT_TIMEOUT_S):
                continue  # heartbeats missed while the database was down are no sign of a dead worker
            for what, row in reaping.reap().each():
                log.warning("%s lost (%s); now %s, attempt %s", what, row.error, row.status, row.attempt)
        except Exception as exc:
            log.exception("reaping lost runs and jobs failed; trying again in %.0f s", interval_s)
            if isinstance(exc, UNREACHABLE):
                note_unreachable()
        finally:
            close_old_connections()


def dispatch_forever(interval_s: float) -> None:
    """Every `interval_s`, send the messages of queued runs and rollout jobs that may be missing."""
    while True:
        time.sleep(interval_s)
        try:
            for what in dispatch.dispatch():
                log.warning("re-sent the message of %s: it was not sent or the broker lost it", what)
        except Exception as exc:
            log.warning(
                "dispatching queued work failed (%s: %s); trying again in %.0f s",
                type(exc).__name__,
                exc,
                interval_s,
            )
        finally:
            close_old_connections()


def deliver_alerts_forever(interval_s: float) -> None:
    """Every `interval_s`, deliver the team alerts that are due (`alerts.deliver.deliver_due`)."""
    from alerts.deliver import deliver_due

    while True:
        time.sleep(interval_s)
        try:
            deliver_due()
        except Exception as exc:
            log.warning(
                "delivering alerts failed (%s: %s); trying again in %.0f s",
                type(exc).__name__,
                exc,
                interval_s,
            )
        finally:
            close_old_connections()


def limit_torch_threads(threads: int) -> None:
    """Make this process train with `threads` CPU threads: torch's intra-op pool, its inter-op
    pool while torch still allows setting it, and OpenMP/MKL if torch has not loaded them yet."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)
    import torch

    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):  # torch refuses once inter-op work has run; not yet at start-up
        torch.set_num_interop_threads(threads)


@worker_init.connect
def _limit_torch_threads(sender, **kwargs) -> None:
    limit_torch_threads(settings.LAB_TORCH_THREADS)


@worker_ready.connect
def _start_reaper(sender, **kwargs) -> None:
    import torch

    log.info(
        "worker %s ready on %s (Python %s), torch threads %s (inter-op %s)",
        worker_identity(),
        platform.system(),
        platform.python_version(),
        torch.get_num_threads(),
        torch.get_num_interop_threads(),
    )
    queues = sorted(app.amqp.queues.consume_from)  # what -Q selected
    threading.Thread(
        target=reap_forever, args=(settings.LAB_REAP_INTERVAL_S, queues), name="reaper", daemon=True
    ).start()
    threading.Thread(
        target=dispatch_forever, args=(settings.LAB_DISPATCH_INTERVAL_S,), name="dispatcher", daemon=True
    ).start()
    if not settings.LAB_ALERTS_DELIVER:
        log.info("this worker delivers no team alerts (LAB_ALERTS_DELIVER=0)")
        return
    threading.Thread(
        target=deliver_alerts_forever, args=(settings.LAB_ALERTS_INTERVAL_S,), name="alerts", daemon=True
    ).start()
