"""The rollout worker's jobs: part of one step's batch, or part of one evaluation, made with
published weights.

`generate(job_id, attempt)` is the plain entry point (the Celery task only calls it): claim
the job for this attempt, load the policy version it needs (distributed: the job's; async:
the newest published) from the run's buffer, generate and score its prompt groups with
`rlcore.produce.Producer`, write the batch file and mark the job done. An eval job evaluates
its version on its held-out problems (`rlcore.trainer.evaluate_part`, with a copy of the
policy next to the rollout engine) and stores the sums on the job. Batches come first: before
an eval job the worker makes the run's queued batch jobs, which the trainer is or will soon be
waiting for (their own messages then find them taken and do nothing). A heartbeat thread
keeps the lease while it generates; if the worker dies, the reaper re-queues the job and
another worker makes the same batch. A worker keeps the producers (tokenizer, θ0, engine)
of the runs it served last, so consecutive jobs of one run load only new weights. Its database
calls ride out a short outage (`retry_db`).
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field

import torch
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
class Held:
    """Which published version a model holds."""

    version: int | None = None
    sha256: str = ""


@dataclass
class Loaded:
    producer: Producer
    engine: Held = field(default_factory=Held)  # the policy version the rollout engine holds
    evaluator: torch.nn.Module | None = None  # a copy of the policy for evaluations, made on demand
    evaluated: Held = field(default_factory=Held)  # the version the evaluator holds


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


def load_version(run: Run, loaded: Loaded, job: RolloutJob) -> int:
    """Put the version the job needs into the engine; return it."""
    return load_into(run, job, loaded.engine, loaded.producer.engine.load_snapshot, "")


def load_evaluator(run: Run, loaded: Loaded, job: RolloutJob) -> torch.nn.Module:
    """The policy of the eval job's version, in the worker's evaluation copy of the model."""
    if loaded.evaluator is None:
        loaded.evaluator = copy.deepcopy(loaded.producer.lm.model).eval().requires_grad_(False)
    load_into(run, job, loaded.evaluated, loaded.evaluator.load_state_dict, " for evaluation")
    return loaded.evaluator


@retry_db
def load_into(run: Run, job: RolloutJob, held: Held, load, purpose: str) -> int:
    """Load the version `job` needs with `load(weights)` unless `held` says it is there; return it."""
    for _ in range(LOAD_TRIES):
        if job.version is not None:
            row = PolicyVersion.objects.get(run=run, version=job.version)
        else:
            row = newest_version(run)
            if row is None:
                raise RuntimeError("no policy version has been published for this run")
        if (held.version, held.sha256) == (row.version, row.sha256):
            return row.version
        started = time.perf_counter()
        try:
            weights = weight_store(run).load(row.version, row.sha256)
        except FileNotFoundError:
            # Async: the trainer published a newer version and pruned this one meanwhile.
            continue
        load(weights)
        held.version, held.sha256 = row.version, row.sha256
        log.info(
            "run %s: loaded policy version %s%s in %.3f s",
            run.pk,
            row.version,
            purpose,
            time.perf_counter() - started,
        )
        return row.version
    raise RuntimeError(f"could not load policy weights of run {run.pk} after {LOAD_TRIES} tries")


def generate(job_id: int, attempt: int, worker: str) -> str:
    """Execute `attempt` of rollout job `job_id` if it is still queued, after the queued batch
    jobs of its run if it is an eval job; return what happened."""
    for other_id, other_attempt in batches_first(job_id):
        log.info(execute(other_id, other_attempt, worker))
    return execute(job_id, attempt, worker)


@retry_db
def batches_first(job_id: int) -> list[tuple[int, int]]:
    """(id, attempt) of the queued batch jobs of an eval job's run, oldest step first; none for
    a batch job."""
    job = RolloutJob.objects.filter(pk=job_id, kind=RolloutJob.EVAL).values("run_id").first()
    if job is None:
        return []
    queued = RolloutJob.objects.filter(run_id=job["run_id"], kind=RolloutJob.BATCH, status=RolloutJob.QUEUED)
    return list(queued.order_by("step", "part").values_list("pk", "attempt"))


def execute(job_id: int, attempt: int, worker: str) -> str:
    """Claim `attempt` of job `job_id` and make what it asks for."""
    job = claim(job_id, attempt, worker)
    if job is None:
        return f"rollout job {job_id} attempt {attempt}: not queued any more, nothing to do"
    done = threading.Event()
    beating = threading.Thread(target=_beat, args=(job, worker, attempt, done), daemon=True)
    beating.start()
    try:
        run = job.run
        loaded = producer_for(run)
        if job.kind == RolloutJob.EVAL:
            version, path, sha256 = job.version, "", ""
            result = asdict(evaluate(loaded, job, load_evaluator(run, loaded, job)))
        else:
            version, result = load_version(run, loaded, job), None
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
    if not retry_db(job.finish)(worker, attempt, version, str(path), sha256, result):
        return f"rollout job {job_id} attempt {attempt}: no longer this worker's; result dropped"
    return (
        f"rollout job {job_id} attempt {attempt}: {job.kind} of step {job.step} part {job.part} "
        f"done with version {version}"
    )


def evaluate(loaded: Loaded, job: RolloutJob, policy: torch.nn.Module):
    """The eval job's held-out problems, evaluated as the trainer would (θ0 is the producer's model)."""
    from rlcore.trainer import evaluate_part

    producer = loaded.producer
    problems = producer.task.eval_problems(producer.config.eval_size)[job.groups_start : job.groups_stop]
    return evaluate_part(
        producer.config,
        producer.lm,
        policy,
        producer.lm.model,
        producer.task,
        problems,
        job.step,
        job.groups_start,
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
