"""A rollout job's lease, in whichever process makes it (a rollout worker, or a trainer making
its own eval parts while it waits): claim an attempt, make it while one heartbeat thread per
process beats, then finish it or fail it, at once when another attempt would fail alike."""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from django.conf import settings
from django.db import close_old_connections, connection

from experiments.models import RolloutJob
from rlcore.evaluate import EvalSums, Evaluator
from workers.db_outage import retry_db
from workers.memory import OverMemoryCeiling

log = logging.getLogger(__name__)

# Up to this many parameters (512 MiB in float32) an async trainer keeps a copy of its newest
# evaluated weights, to make that evaluation's parts while it waits for batches.
EVAL_COPY_PARAMS = 2**27


class CannotMake(RuntimeError):
    """The job would fail the same way on any attempt (its weights file is missing or damaged):
    it fails at once, saying why, instead of using up its attempts."""


@dataclass(frozen=True)
class Made:
    """What a rollout job made: the version it used, and the batch file (a batch part) or the
    evaluation's sums (an eval part)."""

    version: int
    path: str = ""
    sha256: str = ""
    result: dict | None = None


@retry_db
def claim(job_id: int, attempt: int, worker: str) -> RolloutJob | None:
    """The job, claimed for `attempt` by `worker`; None if it is not queued for that attempt. A
    claim retried after its UPDATE committed but the answer was lost finds the job already ours.
    The UPDATE comes first and the row (with its run) is read once, after it."""
    RolloutJob.claim_pk(job_id, worker, attempt)
    job = RolloutJob.objects.select_related("run").filter(pk=job_id).first()
    mine = job is not None and (job.status, job.worker, job.attempt) == (RolloutJob.RUNNING, worker, attempt)
    return job if mine else None


def make(job: RolloutJob, worker: str, produce: Callable[[], Made]) -> str:
    """Make claimed `job` with `produce()` under its lease, then finish it, or fail it with the
    error; return what happened."""
    attempt = job.attempt
    leases.hold(job, worker, attempt)
    cpu_start = time.process_time()
    try:
        made = produce()
    except Exception as exc:
        log.exception("rollout job %s attempt %s failed", job.pk, attempt)
        if isinstance(exc, OverMemoryCeiling):
            # The ceiling interrupts wherever the job was, a query included: reconnect afresh (as the
            # training task does), or failing the job finds the connection mid-transaction and the
            # job, never failed, is re-queued as lost.
            connection.close()
        leases.release(job)
        # Over the memory ceiling, or weights that cannot be loaded: another attempt would fail alike.
        final = isinstance(exc, OverMemoryCeiling | CannotMake)
        reason = str(exc) if final else f"{type(exc).__name__}: {exc}"
        retry_db(job.fail)(worker, attempt, reason, final)
        return f"rollout job {job.pk} attempt {attempt}: failed"
    except BaseException:
        # Not an error the job can be failed with (a shutdown, or a library's own BaseException such
        # as a Rust panic): the heartbeats stop all the same, so the reaper re-queues the job rather
        # than this process beating for it forever.
        leases.release(job)
        raise
    leases.release(job)
    cpu_s = time.process_time() - cpu_start
    if not retry_db(job.finish)(worker, attempt, made.version, made.path, made.sha256, made.result, cpu_s):
        return f"rollout job {job.pk} attempt {attempt}: no longer this worker's; result dropped"
    return (
        f"rollout job {job.pk} attempt {attempt}: {job.kind} of step {job.step} part {job.part} "
        f"done with version {made.version}"
    )


def evaluate_part(job: RolloutJob, evaluator: Evaluator, policy: torch.nn.Module) -> EvalSums:
    """Eval job `job`'s held-out problems, evaluated as the trainer would, with `policy` holding
    the job's version."""
    return evaluator.evaluate_part(policy, job.step, job.groups_start, job.groups_stop)


class TrainerEvalParts:
    """The eval parts a trainer makes itself while it waits, under the same lease as a rollout
    worker: parts of its newest evaluation, with a copy of that version's weights (`copies`, as in
    async execution, while the model has at most `EVAL_COPY_PARAMS` parameters), else only while
    its own policy still holds that version."""

    def __init__(self, run_id: int, worker: str, copies: bool):
        self.run_id, self.worker, self.copies = run_id, worker, copies
        self.evaluator: Evaluator | None = None  # known from the first evaluation on
        self.policy: torch.nn.Module | None = None  # the trainer's live policy, likewise
        self.version: int | None = None  # the newest evaluation's
        self.copy: torch.nn.Module | None = None  # its weights, when copied
        # The version the trainer's policy holds now: known from a publish or an evaluation until
        # the update after the next `take` changes the policy (None meanwhile).
        self.policy_version: int | None = None
        self.made = 0
        self.seconds = 0.0  # spent making them

    def newest(self, step: int, policy: torch.nn.Module, evaluator: Evaluator) -> None:
        """The trainer evaluates `step`: its parts are the ones to make from now on."""
        self.evaluator, self.policy = evaluator, policy
        self.policy_version = self.version = step
        if self.copies and sum(p.numel() for p in policy.parameters()) <= EVAL_COPY_PARAMS:
            if self.copy is None:  # θ0 is the policy's architecture, without gradients
                self.copy = copy.deepcopy(evaluator.initial)
            self.copy.load_state_dict(policy.state_dict())

    def make_one(self) -> bool:
        """Make one queued part of the newest evaluation here, with its weights (the copy, or the
        trainer's own policy while it holds them), θ0 and tokenizer; True if it made one."""
        evaluator, version = self.evaluator, self.version
        if evaluator is None or version is None:
            return False
        policy = self.copy if self.copy is not None else self.policy
        if policy is self.policy and self.policy_version != version:
            return False  # the policy has moved on since
        started = time.perf_counter()  # claiming the part is part of making it
        job = self._claim(version)
        if job is None:
            return False

        def produce() -> Made:
            return Made(version, result=asdict(evaluate_part(job, evaluator, policy)))

        log.info("trainer: %s", make(job, self.worker, produce))
        self.made += 1
        self.seconds += time.perf_counter() - started
        return True

    def _claim(self, version: int) -> RolloutJob | None:
        """A queued part of `version`, claimed for the trainer, from the last (rollout workers take
        the first ones first); None if there is none left."""
        queued = retry_db(
            lambda: list(
                RolloutJob.objects.filter(
                    run_id=self.run_id, kind=RolloutJob.EVAL, version=version, status=RolloutJob.QUEUED
                )
                .order_by("-part")
                .values_list("pk", "attempt")
            )
        )()
        for pk, attempt in queued:
            job = claim(pk, attempt, self.worker)
            if job is not None:
                return job
        return None


class Leases:
    """The jobs this process is making, and one thread that beats their heartbeats every quarter
    of `LAB_HEARTBEAT_TIMEOUT_S` (at least 0.2 s) while there are any; it ends, closing its
    database connection, at the first beat that finds none."""

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
