"""The rollout worker's job: generate part of one step's batch with published weights.

`generate(job_id, attempt)` is the plain entry point (the Celery task only calls it): claim
the job for this attempt, load the policy version it needs (distributed: the job's; async:
the newest published) from the run's buffer, generate and score its prompt groups with
`rlcore.produce.Producer`, write the batch file and mark the job done. A heartbeat thread
keeps the lease while it generates; if the worker dies, the reaper re-queues the job and
another worker makes the same batch. A worker keeps the producers (tokenizer, θ0, engine)
of the runs it served last, so consecutive jobs of one run load only new weights. Its database
calls ride out a short outage (`retry_db`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from django.conf import settings
from django.db import close_old_connections, connection
from experiments.models import PolicyVersion, RolloutJob, Run

from rlcore.produce import Producer
from workers.db_outage import retry_db
from workers.source import batch_path, newest_version, weight_store

log = logging.getLogger(__name__)

CACHED_RUNS = 2
LOAD_TRIES = 5


@dataclass
class Loaded:
    producer: Producer
    version: int | None = None  # the policy version the engine holds
    sha256: str = ""


_producers: OrderedDict[int, Loaded] = OrderedDict()


def producer_for(run: Run) -> Loaded:
    """The run's producer, built once per worker (θ0 from the shared model cache)."""
    if run.pk in _producers:
        _producers.move_to_end(run.pk)
        return _producers[run.pk]
    from rlcore import models, tasks
    from rlcore.produce import make_engine
    from rlcore.trainer import resolve_device

    config = run.run_config()
    task = tasks.build(config.task)
    lm = models.load(config, resolve_device(config.device), settings.LAB_CACHE_DIR, task)
    loaded = Loaded(Producer(config, task, lm, make_engine(config, lm, settings.LAB_CACHE_DIR, task)))
    _producers[run.pk] = loaded
    while len(_producers) > CACHED_RUNS:
        _producers.popitem(last=False)
    return loaded


@retry_db
def load_version(run: Run, loaded: Loaded, job: RolloutJob) -> int:
    """Put the version the job needs into the engine; return it."""
    for _ in range(LOAD_TRIES):
        if job.version is not None:
            row = PolicyVersion.objects.get(run=run, version=job.version)
        else:
            row = newest_version(run)
            if row is None:
                raise RuntimeError("no policy version has been published for this run")
        if (loaded.version, loaded.sha256) == (row.version, row.sha256):
            return row.version
        started = time.perf_counter()
        try:
            weights = weight_store(run).load(row.version, row.sha256)
        except FileNotFoundError:
            # Async: the trainer published a newer version and pruned this one meanwhile.
            continue
        loaded.producer.engine.load_snapshot(weights)
        loaded.version, loaded.sha256 = row.version, row.sha256
        log.info(
            "run %s: loaded policy version %s in %.3f s", run.pk, row.version, time.perf_counter() - started
        )
        return row.version
    raise RuntimeError(f"could not load policy weights of run {run.pk} after {LOAD_TRIES} tries")


def generate(job_id: int, attempt: int, worker: str) -> str:
    """Execute `attempt` of rollout job `job_id` if it is still queued; return what happened."""
    job = claim(job_id, attempt, worker)
    if job is None:
        return f"rollout job {job_id} attempt {attempt}: not queued any more, nothing to do"
    done = threading.Event()
    beating = threading.Thread(target=_beat, args=(job, worker, attempt, done), daemon=True)
    beating.start()
    try:
        run = job.run
        loaded = producer_for(run)
        version = load_version(run, loaded, job)
        batch = loaded.producer.batch(job.step, version, range(job.groups_start, job.groups_stop))
        path = batch_path(run, job.step, job.part, attempt)
        sha256 = batch.save(path)
    except Exception as exc:
        log.exception("rollout job %s attempt %s failed", job_id, attempt)
        done.set()
        beating.join()
        retry_db(job.fail)(worker, attempt, f"{type(exc).__name__}: {exc}")
        return f"rollout job {job_id} attempt {attempt}: failed"
    done.set()
    beating.join()
    if not retry_db(job.finish)(worker, attempt, version, str(path), sha256):
        return f"rollout job {job_id} attempt {attempt}: no longer this worker's; result dropped"
    return (
        f"rollout job {job_id} attempt {attempt}: step {job.step} part {job.part} done with version {version}"
    )


@retry_db
def claim(job_id: int, attempt: int, worker: str) -> RolloutJob | None:
    """The job, claimed for `attempt` by `worker`; None if it is not queued for that attempt. A
    claim retried after its UPDATE committed but the answer was lost finds the job already ours."""
    job = RolloutJob.objects.select_related("run").filter(pk=job_id).first()
    if job is None:
        return None
    if job.claim(worker, attempt):
        return job
    mine = (job.status, job.worker, job.attempt) == (RolloutJob.RUNNING, worker, attempt)
    return job if mine else None


def _beat(job: RolloutJob, worker: str, attempt: int, done: threading.Event) -> None:
    interval = max(0.2, settings.LAB_HEARTBEAT_TIMEOUT_S / 4)
    try:
        while not done.wait(interval):
            try:
                job.beat(worker, attempt)
            except Exception:
                log.exception("rollout job %s: heartbeat failed; retrying", job.pk)
                close_old_connections()
    finally:
        connection.close()
