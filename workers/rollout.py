"""The rollout worker: woken by a message, it makes every job queued on that queue (batch jobs
first, then the oldest) with the producers (tokenizer, θ0, engine) of the runs it served last,
each job under its run's memory ceiling and its lease (`workers.jobs`); a batch job loads the
weights it needs from the run's buffer (`workers.buffer`), generates and scores its prompt groups
and writes the batch file, an eval job evaluates its version on its held-out problems."""

from __future__ import annotations

import copy
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
from django.conf import settings

from experiments.models import DatasetMismatch, PolicyVersion, RolloutJob, Run
from rlcore.evaluate import Evaluator
from rlcore.produce import Producer
from rlcore.rollout import HFEngine
from workers.buffer import batch_path, newest_version, weight_store
from workers.db_outage import retry_db
from workers.jobs import CannotMake, Made, claim, evaluate_part, make
from workers.memory import MemoryCeiling, import_model_libraries

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

    config = run.run_config()
    try:
        retry_db(run.check_datasets)(tasks.dataset_sha256s(config.task))
    except DatasetMismatch as exc:  # edited while the run trains: its batches would mix versions
        raise CannotMake(str(exc)) from None
    task = tasks.build(config.task)
    lm = models.load(config, models.resolve_device(config.device), settings.LAB_CACHE_DIR, task)
    # `lm.model` stays θ0 here: the engine and the evaluator hold copies of their own.
    engine = make_engine(config, lm, settings.LAB_CACHE_DIR, task)
    initial = lm.model if config.execution.init_logprobs in ("rollout", "auto") else None
    loaded = Loaded(Producer(config, task, lm, engine, initial))
    _producers[run.pk] = loaded
    while len(_producers) > CACHED_RUNS:
        _producers.popitem(last=False)
    return loaded


def load_version(run: Run, loaded: Loaded, job: RolloutJob) -> int:
    """Put the version the job needs into the engine; return it."""
    return load_into(run, job, loaded.engine, loaded.producer.engine.load_snapshot, "")


def load_evaluator(run: Run, loaded: Loaded, job: RolloutJob) -> torch.nn.Module:
    """The policy of the eval job's version, in the worker's evaluation copy of the model: copied
    from the HF engine when that holds the version already (an evaluation's version is the next
    batch's, which comes first), else loaded from the store."""
    if loaded.evaluator is None:
        loaded.evaluator = copy.deepcopy(loaded.producer.lm.model).eval().requires_grad_(False)
    engine = loaded.producer.engine
    copy_from = (loaded.engine, engine.model.state_dict) if isinstance(engine, HFEngine) else None
    load_into(run, job, loaded.evaluated, loaded.evaluator.load_state_dict, " for evaluation", copy_from)
    return loaded.evaluator


@retry_db
def newest_published(run: Run, at_least: int) -> int:
    """The newest version the trainer has published (the staleness split of an async batch)."""
    row = newest_version(run)
    return max(at_least, row.version if row is not None else at_least)


@retry_db
def load_into(
    run: Run,
    job: RolloutJob,
    held: Held,
    load: Callable[[dict[str, torch.Tensor]], None],
    purpose: str,
    copy_from: tuple[Held, Callable[[], dict[str, torch.Tensor]]] | None = None,
) -> int:
    """Load the version `job` needs with `load(weights)` unless `held` says it is there; return it.
    `copy_from`: another model of this worker (what it holds, its weights), used instead of the
    store when it holds that version."""
    store = weight_store(run)
    for _ in range(LOAD_TRIES):
        if job.version is not None:
            row = PolicyVersion.objects.filter(run=run, version=job.version).first()
            if row is None:
                raise RuntimeError(f"policy version {job.version} of run {run.pk} was never published")
        else:
            row = newest_version(run)
            if row is None:
                raise RuntimeError("no policy version has been published for this run")
        if (held.version, held.sha256) == (row.version, row.sha256):
            return row.version
        started = time.perf_counter()
        if copy_from is not None and (copy_from[0].version, copy_from[0].sha256) == (row.version, row.sha256):
            weights = copy_from[1]()
        else:
            try:
                weights = store.load(row.version, row.sha256)
            except FileNotFoundError:
                if job.version is None:
                    continue  # async: the trainer published a newer version and pruned this one meanwhile
                raise CannotMake(
                    f"the weights of policy version {row.version} are missing from the run's buffer "
                    f"({store.path(row.version)}): deleted while a job still needed them"
                ) from None
            except ValueError as exc:  # the bytes do not match the recorded sha256
                raise CannotMake(str(exc)) from None
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
    raise RuntimeError(
        f"could not load the newest policy weights of run {run.pk}: {LOAD_TRIES} times in a row its newest "
        "version's file was missing (the trainer removes versions no job needs; is it publishing?)"
    )


def generate(job_id: int, attempt: int, worker: str) -> str:
    """If `attempt` of rollout job `job_id` is still queued, make the jobs queued on its queue,
    most urgent first (`next_queued`), until none is left (it among them, unless another worker
    takes it first); return what happened.

    A message wakes the worker; the database says what to make. Draining the queue here, instead
    of one job a message, saves the broker's delivery between consecutive jobs (in an async run
    a trainer step's worth of time on a small model); the messages of jobs made this way then
    do nothing, without a query for those this worker tried itself (`_tried`). A late message
    (its attempt is over) does nothing at all."""
    if (job_id, attempt) in _tried:
        return f"rollout job {job_id} attempt {attempt}: tried here already, nothing to do"
    queue = queued_on(job_id, attempt)
    if queue is None:
        return f"rollout job {job_id} attempt {attempt}: not queued any more, nothing to do"
    made = []
    while (job := next_queued(queue)) is not None:
        outcome = execute(*job, worker)
        _tried[job] = None
        while len(_tried) > TRIED_KEPT:
            _tried.popitem(last=False)
        log.info(outcome)
        made.append(outcome)
    return f"rollout job {job_id} attempt {attempt}: woke the worker; {len(made)} jobs of queue {queue} made"


# (id, attempt) of the jobs this worker's drains took up, newest last: each such attempt is over
# (made, failed or taken by another worker), so its message has nothing left to ask.
_tried: OrderedDict[tuple[int, int], None] = OrderedDict()
TRIED_KEPT = 10_000


@retry_db
def queued_on(job_id: int, attempt: int) -> str | None:
    """The queue of job `job_id` if its `attempt` is queued, else None."""
    row = (
        RolloutJob.objects.filter(pk=job_id, attempt=attempt, status=RolloutJob.QUEUED)
        .values("queue")
        .first()
    )
    return row["queue"] if row is not None else None


@retry_db
def next_queued(queue: str) -> tuple[int, int] | None:
    """(id, attempt) of the most urgent queued job of `queue`: batch jobs before eval jobs (a
    trainer is or will soon be waiting for a batch, never for an evaluation), then the oldest
    (first created: across runs first come, first served; within a run, step order)."""
    return (
        RolloutJob.objects.filter(queue=queue, status=RolloutJob.QUEUED)
        .order_by("kind", "pk")
        .values_list("pk", "attempt")
        .first()
    )


@retry_db
def queued_behind(job: RolloutJob) -> bool:
    """Whether another job waits on `job`'s queue (`execution.init_logprobs: auto` leaves θ0's
    log-probs to the trainer then, rather than make that job wait for them)."""
    return RolloutJob.objects.filter(queue=job.queue, status=RolloutJob.QUEUED).exists()


def execute(job_id: int, attempt: int, worker: str) -> str:
    """Claim `attempt` of job `job_id` and make what it asks for."""
    # The run's memory ceiling holds around its rollout jobs too (the trainer's eval parts are
    # made inside its own ceiling); the libraries every job loads are not the job's. Imported
    # before the claim: the first time takes seconds, and a claimed job has no heartbeat yet.
    import_model_libraries()
    job = claim(job_id, attempt, worker)
    if job is None:
        return f"rollout job {job_id} attempt {attempt}: not queued any more, nothing to do"
    on_cpu = job.run.config.get("device", "auto") == "cpu" or not torch.cuda.is_available()
    ceiling = MemoryCeiling(settings.LAB_RUN_MEMORY_MB, limit_address_space=on_cpu)
    return make(job, worker, lambda: ceiling.call(_make_here, job))


def _make_here(job: RolloutJob) -> Made:
    """The job's batch part or evaluation part, with this worker's producer of its run."""
    run = job.run
    loaded = producer_for(run)
    producer = loaded.producer
    if job.kind == RolloutJob.EVAL:
        policy = load_evaluator(run, loaded, job)
        evaluator = Evaluator(producer.config, producer.lm, producer.lm.model, producer.task)
        return Made(job.version, result=asdict(evaluate_part(job, evaluator, policy)))
    version = load_version(run, loaded, job)
    auto = producer.config.execution.init_logprobs == "auto"
    spare_time = (lambda: not queued_behind(job)) if auto else None
    batch = producer.batch(job.step, version, range(job.groups_start, job.groups_stop), spare_time)
    if producer.config.execution.mode == "async":
        ready = newest_published(run, version)
        batch.ready_versions = torch.full((len(batch.problems),), ready, dtype=torch.long)
    path = batch_path(run, job.step, job.part, job.attempt)
    return Made(version, str(path), batch.save(path))
