"""The rollout worker's jobs: part of one step's batch, or part of one evaluation, made with
published weights.

`generate(job_id, attempt)` is the plain entry point (the Celery task only calls it). A
message wakes the worker and the database says what to make: the worker makes every job queued
on the message's queue, batch jobs first (a trainer is or will soon be waiting for them), then
the oldest, until none is left; the messages of the jobs it made that way find them taken and
do nothing, and a late message (its attempt is over) does nothing at all. Each job is claimed
for its attempt (`execute`), then made under its lease (`make`: a heartbeat thread beats while
it runs; if the worker dies, the reaper re-queues the job and another worker makes the same
batch): a batch job loads the policy version it needs (distributed: the job's; async: the
newest published) from the run's buffer, generates and scores its prompt groups with
`rlcore.produce.Producer` (with θ0's log-probs when the run's `execution.init_logprobs` is
`rollout`, or `auto` and no other job waits on the worker's queue) and writes the batch file; an
eval job evaluates its version on its held-out problems (`rlcore.trainer.evaluate_part`, with a
copy of the policy next to the rollout engine) and stores the sums on the job. A job runs under
its run's memory ceiling (`LAB_RUN_MEMORY_MB`, as the trainer does); over it, or with weights
that are missing or damaged (`CannotMake`), it fails at once, saying why. A waiting
trainer makes eval parts of its own run through the same `make` (`workers.source`). A worker
keeps the producers (tokenizer, θ0, engine) of the runs it served last, so consecutive jobs of
one run load only new weights. Its database calls ride out a short outage (`retry_db`).
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
from django.conf import settings
from django.db import close_old_connections, connection
from experiments.models import PolicyVersion, RolloutJob, Run

from rlcore.produce import Producer
from rlcore.rollout import HFEngine
from workers.db_outage import retry_db
from workers.memory import MemoryCeiling, OverMemoryCeiling
from workers.source import batch_path, newest_version, weight_store

log = logging.getLogger(__name__)

CACHED_RUNS = 2
LOAD_TRIES = 5


class CannotMake(RuntimeError):
    """The job would fail the same way on any attempt (its weights file is missing or damaged):
    it fails at once, saying why, instead of using up its attempts."""


@dataclass
class Held:
    """Which published version a model holds."""

    version: int | None = None
    sha256: str = ""


@dataclass(frozen=True)
class Made:
    """What a rollout job made: the version it used, and the batch file (a batch part) or the
    evaluation's sums (an eval part)."""

    version: int
    path: str = ""
    sha256: str = ""
    result: dict | None = None


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
    job = claim(job_id, attempt, worker)
    if job is None:
        return f"rollout job {job_id} attempt {attempt}: not queued any more, nothing to do"
    # The run's memory ceiling holds around its rollout jobs too (the trainer's eval parts are
    # made inside its own ceiling); the libraries every job loads are not the job's.
    import transformers  # noqa: F401

    on_cpu = job.run.config.get("device", "auto") == "cpu" or not torch.cuda.is_available()
    ceiling = MemoryCeiling(settings.LAB_RUN_MEMORY_MB, limit_address_space=on_cpu)
    return make(job, worker, lambda: ceiling.call(_make_here, job))


def make(job: RolloutJob, worker: str, produce: Callable[[], Made]) -> str:
    """Make claimed `job` with `produce()` under its lease (the process's heartbeat thread beats
    it while it runs), then finish it, or fail it with the error; return what happened. The
    rollout worker's jobs and the eval parts a waiting trainer makes itself (`DatabaseSource`)
    both end here."""
    attempt = job.attempt
    leases.hold(job, worker, attempt)
    try:
        made = produce()
    except Exception as exc:
        log.exception("rollout job %s attempt %s failed", job.pk, attempt)
        leases.release(job)
        # Over the memory ceiling, or weights that cannot be loaded: another attempt would fail alike.
        final = isinstance(exc, OverMemoryCeiling | CannotMake)
        reason = str(exc) if final else f"{type(exc).__name__}: {exc}"
        retry_db(job.fail)(worker, attempt, reason, final)
        return f"rollout job {job.pk} attempt {attempt}: failed"
    leases.release(job)
    if not retry_db(job.finish)(worker, attempt, made.version, made.path, made.sha256, made.result):
        return f"rollout job {job.pk} attempt {attempt}: no longer this worker's; result dropped"
    return (
        f"rollout job {job.pk} attempt {attempt}: {job.kind} of step {job.step} part {job.part} "
        f"done with version {made.version}"
    )


def _make_here(job: RolloutJob) -> Made:
    """The job's batch part or evaluation part, with this worker's producer of its run."""
    run = job.run
    loaded = producer_for(run)
    producer = loaded.producer
    if job.kind == RolloutJob.EVAL:
        policy = load_evaluator(run, loaded, job)
        sums = evaluate_part(job, producer.config, producer.lm, policy, producer.lm.model, producer.task)
        return Made(job.version, result=asdict(sums))
    version = load_version(run, loaded, job)
    auto = producer.config.execution.init_logprobs == "auto"
    spare_time = (lambda: not queued_behind(job)) if auto else None
    batch = producer.batch(job.step, version, range(job.groups_start, job.groups_stop), spare_time)
    path = batch_path(run, job.step, job.part, job.attempt)
    return Made(version, str(path), batch.save(path))


def evaluate_part(job: RolloutJob, config, lm, policy: torch.nn.Module, initial: torch.nn.Module, task):
    """Eval job `job`'s held-out problems, evaluated as the trainer would: `policy` (holding the
    job's version) against θ0 (`initial`), with `lm`'s tokenizer and the run's task."""
    from rlcore import trainer

    problems = task.eval_problems(config.eval_size)[job.groups_start : job.groups_stop]
    return trainer.evaluate_part(config, lm, policy, initial, task, problems, job.step, job.groups_start)


@retry_db
def claim(job_id: int, attempt: int, worker: str) -> RolloutJob | None:
    """The job, claimed for `attempt` by `worker`; None if it is not queued for that attempt. A
    claim retried after its UPDATE committed but the answer was lost finds the job already ours.
    The UPDATE comes first and the row (with its run) is read once, after it."""
    RolloutJob.claim_pk(job_id, worker, attempt)
    job = RolloutJob.objects.select_related("run").filter(pk=job_id).first()
    mine = job is not None and (job.status, job.worker, job.attempt) == (RolloutJob.RUNNING, worker, attempt)
    return job if mine else None


class Leases:
    """The jobs this process is making, and one thread that beats their heartbeats every quarter
    of `LAB_HEARTBEAT_TIMEOUT_S` (at least 0.2 s) while there are any. A thread per job cost a
    small job a tenth of its time in starting and joining; this one lives while jobs follow each
    other and ends, closing its database connection, at the first beat that finds none."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, tuple[RolloutJob, str, int]] = {}
        self._thread: threading.Thread | None = None

    def hold(self, job: RolloutJob, worker: str, attempt: int) -> None:
        with self._lock:
            self._held[job.pk] = (job, worker, attempt)
            if self._thread is None:
                self._thread = threading.Thread(target=self._beat, name="rollout-heartbeat", daemon=True)
                self._thread.start()

    def release(self, job: RolloutJob) -> None:
        with self._lock:
            self._held.pop(job.pk, None)

    def _beat(self) -> None:
        try:
            while True:
                time.sleep(max(0.2, settings.LAB_HEARTBEAT_TIMEOUT_S / 4))
                with self._lock:
                    held = list(self._held.values())
                    if not held:
                        self._thread = None
                        return
                for job, worker, attempt in held:
                    try:
                        job.beat(worker, attempt)  # a job finished meanwhile: beats nothing
                    except Exception:
                        log.exception("rollout job %s: heartbeat failed; retrying", job.pk)
                        close_old_connections()
        finally:
            connection.close()


leases = Leases()
