"""A run's trainer in `execution.train_processes` ranks, started by the training worker.

The worker's Celery process never initialises torch.distributed: `train` starts torchrun
(`rlcore.launch.start_ranks`) with N ranks that each run `python -m workers.ranks RUN ATTEMPT
WORKER FOLDER`, in a process group of their own, with the worker's torch threads ÷ N each, and
waits. Every `POLL_S` it beats the run's heartbeat and asks whether the run was cancelled or is
no longer this worker's (what `DatabaseSink.should_stop` reads); then rank 0 stops at its step
boundary by itself, and whatever is still running `STOP_GRACE_S` later is ended
(`launch.stop_ranks`). A worker that dies takes torchrun with it (its parent-death signal), and
torchrun its ranks.

Inside a rank (`main`): Django is set up, and rank 0 reports through a `DatabaseSink` and a
`CheckpointLedger` under the parent worker's identity (the run stays that worker's), and in
distributed and async execution holds the run's `DatabaseSource` (it publishes the whole weights
gathered from the shards; the other ranks get each batch from rank 0), then writes its summary,
with the attempt's measurement, to `result.json` in the attempt's folder (`run_folder`: the run's
folder under `LAB_RUNS_DIR`, beside its checkpoints); the other ranks report nothing. A rank
that raises writes `error-rank<R>.json`; the parent fails the attempt with the first one
(`RanksFailed`), or with torchrun's own account of a rank that died without one (rank 0's
`BufferDamaged` re-queues the run, as in one process). A rank killed from outside (SIGKILL, the
OOM killer) is `RankKilled`: like a lost worker, the run is re-queued to resume from its
checkpoint. A rank that gave up waiting in a collective (`LAB_RANK_TIMEOUT_S`: a peer hung)
fails the attempt naming the timeout, and the parent SIGKILLs torchrun and every rank at once
(torchrun would give a hung rank 30 s after a SIGTERM it may not act on); ranks still running
`ERROR_GRACE_S` after any other failure go the same way, so a hang never holds the worker. Each
rank's output is kept under the
attempt's folder (`logs/`). The parent ends the run (`Run.finish`, `Run.fail`) as for a run
trained in one process.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

POLL_S = 1.0
STOP_GRACE_S = 2.0  # a stopped run's rank 0 finishes its step and stores what it logged
KILL_GRACE_S = 4.0  # then SIGTERM, and SIGKILL this long after
ERROR_GRACE_S = 10.0  # after a rank failed, torchrun's time to end the others and say how they ended
RESULT = "result.json"
EXECUTION = "execution.json"  # a failed attempt's execution report (distributed and async execution)
OUTPUT = "torchrun.log"
REPO = Path(__file__).resolve().parents[1]


class RanksFailed(RuntimeError):
    """A trainer rank exited with an error: the attempt fails with it, and with the execution
    report rank 0's batch source left (`execution`; None in simulated execution). `rank` and
    `error_type` (the exception's class name) are the failing rank's, where it wrote its error."""

    def __init__(
        self,
        message: str,
        execution: dict[str, float] | None = None,
        rank: int | None = None,
        error_type: str | None = None,
    ):
        super().__init__(message)
        self.execution, self.rank, self.error_type = execution, rank, error_type


class RankKilled(RanksFailed):
    """A trainer rank was killed by a signal from outside (SIGKILL, the OOM killer) without an
    error of its own: not the run's fault, like a lost worker; the run is re-queued while it has
    attempts left, and resumes from its checkpoint."""


# Signals a process raises on itself (a crash, an abort): the rank's own failure, not a kill.
SELF_RAISED = {signal.SIGTERM, signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL}
# How a rank's error reads when a collective gave up waiting for a peer (gloo, NCCL's watchdog).
TIMED_OUT = re.compile(r"Timed out waiting \d+ ?ms|collective operation timeout")


def run_folder(run: Any) -> Path:
    """The attempt's folder of rank files (results, errors, logs), beside the run's checkpoints."""
    return run.checkpoint_dir.parent / f"ranks-attempt-{run.attempt}"


# ----- the worker's side ---------------------------------------------------------------------


def train(run: Any, worker: str, processes: int) -> dict[str, float]:
    """Train `run` in `processes` ranks; rank 0's summary, or, if the run was stopped before rank
    0 wrote one, the summary of what it logged. Raises `RanksFailed` when a rank failed."""
    from django.conf import settings

    from rlcore import launch
    from workers.db_outage import retry_db

    folder = run_folder(run)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    threads = max(1, settings.LAB_TORCH_THREADS // processes)
    with (folder / OUTPUT).open("wb") as output:
        proc = launch.start_ranks(
            ["-m", "workers.ranks", run.pk, run.attempt, worker, folder],
            processes,
            log_dir=folder / "logs",
            threads=threads,
            env={"MKL_NUM_THREADS": str(threads)},
            cwd=REPO,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        log.info(
            "run %s attempt %s: %s trainer ranks (torchrun pid %s)", run.pk, run.attempt, processes, proc.pid
        )
        try:
            code = _wait(proc, run, worker, retry_db)
        except BaseException:
            launch.stop_ranks(proc, grace_s=KILL_GRACE_S)
            raise
    result = folder / RESULT
    if code == 0 and result.exists():
        return json.loads(result.read_text())["summary"]
    if retry_db(run.stop_requested)(worker):
        log.info("run %s attempt %s: stopped; its ranks ended (%s)", run.pk, run.attempt, code)
        return retry_db(run.summary_from_points)()
    failed = failure(folder, code)
    failed.execution = _execution(folder)
    raise as_raised(failed)


def as_raised(failed: RanksFailed) -> Exception:
    """What the attempt fails with: rank 0's `BufferDamaged` as itself (its batch source cannot go
    on from here: the run is re-queued, as for one process), else `failed`."""
    if failed.rank == 0 and failed.error_type == "BufferDamaged":
        from workers.source import BufferDamaged

        damaged = BufferDamaged(str(failed))
        damaged.execution = failed.execution  # type: ignore[attr-defined]
        return damaged
    return failed


def _execution(folder: Path) -> dict[str, float] | None:
    """The execution report rank 0 left when its attempt failed (`EXECUTION`), if any."""
    try:
        return json.loads((folder / EXECUTION).read_text())
    except (OSError, ValueError):
        return None


def _wait(proc: subprocess.Popen, run: Any, worker: str, retry_db) -> int:
    """torchrun's exit status, once it ends or has been ended after the run was stopped."""
    from rlcore import launch

    folder = run_folder(run)
    failed_at = None
    while True:
        try:
            return proc.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            pass
        errors = [error for _, error in _errors(folder)]
        if errors and failed_at is None:
            failed_at = time.monotonic()
        if errors and (
            any(TIMED_OUT.search(error["error"]) for error in errors)
            or time.monotonic() - failed_at > ERROR_GRACE_S
        ):
            # A rank failed and torchrun still waits on another: one that hung (stopped, stuck:
            # its peer timed out, and torchrun would give it 30 s after a SIGTERM it does not act
            # on), or one slow to go. The attempt is lost: end them all now.
            log.warning("run %s attempt %s: a rank failed; ending the ranks left", run.pk, run.attempt)
            return launch.stop_ranks(proc, grace_s=0)
        retry_db(run.hold)(worker)  # the heartbeat while rank 0 starts up; its progress is rank 0's
        if retry_db(run.stop_requested)(worker):
            try:
                return proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                return launch.stop_ranks(proc, grace_s=KILL_GRACE_S)


def _errors(folder: Path) -> list[tuple[int, dict[str, Any]]]:
    """(rank, {"rank", "type", "error", "time"}) of each rank that wrote its error."""
    found = []
    for path in folder.glob("error-rank*.json"):
        try:
            error = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being written
        found.append((int(error["rank"]), error))
    return found


def failure(folder: Path, code: int) -> RanksFailed:
    """Why the ranks failed. A rank that gave up waiting in a collective names the cause: a peer
    hung (whatever then ended that peer, torchrun's SIGKILL among them, follows from it). Else a
    rank that died by a signal it did not get from torchrun or raise on itself (SIGKILL, the OOM
    killer) without saying why is the cause (`RankKilled`): the others' errors follow from it (a
    collective whose peer went away). Else the first rank's own error, else torchrun's first
    observed failure, else the end of torchrun's output."""
    errors = dict(_errors(folder))
    try:
        output = (folder / OUTPUT).read_text(errors="replace")
    except OSError:
        output = ""
    timed_out = sorted((e for e in errors.values() if TIMED_OUT.search(e["error"])), key=lambda e: e["time"])
    if timed_out:
        from rlcore.distributed import DEFAULT_TIMEOUT_S, TIMEOUT_ENV

        limit = os.environ.get(TIMEOUT_ENV, f"{DEFAULT_TIMEOUT_S:g}")
        return RanksFailed(
            f"trainer rank {timed_out[0]['rank']} gave up waiting for the other ranks after "
            f"{TIMEOUT_ENV} ({limit} s): {timed_out[0]['error']}"
        )
    ended = [
        (int(rank), int(exit_code))
        for rank, exit_code in re.findall(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)", output)
    ]
    for rank, exit_code in ended:
        if exit_code < 0 and -exit_code not in SELF_RAISED and rank not in errors:
            return RankKilled(
                f"trainer rank {rank} was killed by signal {-exit_code} (torchrun exited with {code})"
            )
    for rank, exit_code in ended:
        if exit_code < 0 and -exit_code != signal.SIGTERM and rank not in errors:
            return RanksFailed(
                f"trainer rank {rank} ended with signal {-exit_code} (torchrun exited with {code})"
            )
    if errors:
        first = min(errors.values(), key=lambda error: error["time"])
        return RanksFailed(
            f"trainer rank {first['rank']} failed: {first['error']}",
            rank=int(first["rank"]),
            error_type=first.get("type"),
        )
    cause = re.search(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", output, re.S)
    if cause:
        rank, exit_code = cause.group(1), int(cause.group(2))
        how = f"signal {-exit_code}" if exit_code < 0 else f"exit code {exit_code}"
        return RanksFailed(f"trainer rank {rank} ended with {how} (torchrun exited with {code})")
    tail = output.strip().splitlines()[-5:]
    return RanksFailed(f"the trainer ranks exited with {code}: " + " | ".join(tail))


# ----- inside a rank -------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    run_id, attempt, worker, folder = int(argv[0]), int(argv[1]), argv[2], Path(argv[3])
    rank = int(os.environ.get("RANK", "0"))
    try:
        import django

        import workers  # noqa: F401  (platform/ on the path, Django's settings)

        django.setup()
        from django.conf import settings

        from experiments.models import Run
        from rlcore import distributed
        from workers.memory import MemoryCeiling, import_model_libraries

        run = Run.objects.get(pk=run_id)
        if run.attempt != attempt or run.worker != worker or run.status != Run.RUNNING:
            raise RuntimeError(f"run {run_id} attempt {attempt} is no longer {worker}'s to train")
        config = run.run_config()
        # Each rank under the run's memory ceiling, counting what it adds to its own resident
        # memory once the model libraries are in (theirs is the process's, as on a worker); the
        # address space is not capped here: the collectives' threads reserve theirs as they go.
        import_model_libraries()
        ceiling = MemoryCeiling(settings.LAB_RUN_MEMORY_MB, limit_address_space=False)
        if rank != 0:
            ceiling.call(
                distributed.train,
                config,
                None,
                checkpoint_dir=run.checkpoint_dir,
                cache_dir=settings.LAB_CACHE_DIR,
            )
            return 0
        summary = ceiling.call(_rank_zero, run, worker, config, folder)
        (folder / f".{RESULT}").write_text(json.dumps({"summary": summary}))
        (folder / f".{RESULT}").replace(folder / RESULT)
        return 0
    except BaseException as exc:
        error = {
            "rank": rank,
            "type": type(exc).__name__,
            "error": f"{type(exc).__name__}: {exc}",
            "time": time.time(),
        }
        (folder / f"error-rank{rank}.json").write_text(json.dumps(error))
        raise


def _rank_zero(run: Any, worker: str, config: Any, folder: Path) -> dict[str, float]:
    """Rank 0's part: it reports through a `DatabaseSink` and, outside simulated execution, holds
    the run's `DatabaseSource` (built as a one-process trainer builds it): the weights it publishes
    are the whole ones gathered from the shards (`distributed.RankSource`), the same file and
    sha256 as one process's, and its execution report joins the summary. A failed attempt leaves
    that report in `EXECUTION` for the worker to record with the failure."""
    from django.conf import settings

    from imports import mirror as mirrors
    from rlcore import distributed
    from rlcore.tasks import dataset_sha256s
    from workers.db_outage import retry_db
    from workers.measure import Measurement, sibling_pids
    from workers.sink import CheckpointLedger, DatabaseSink, measurement, note_mirror
    from workers.source import DatabaseSource

    # The attempt's CPU is every rank's: rank 0 reads its fellow ranks' from /proc.
    sink = DatabaseSink(run, worker, Measurement(others=sibling_pids))
    reporting, mirror = mirrors.reporting(run, sink)  # `sink` alone unless the run is mirrored
    source = None
    try:
        retry_db(run.check_datasets)(dataset_sha256s(config.task))
        if config.execution.mode != "simulated":
            source = DatabaseSource(run, config, sink.should_stop, worker)
        summary = distributed.train(
            config,
            reporting,
            checkpoint_dir=run.checkpoint_dir,
            cache_dir=settings.LAB_CACHE_DIR,
            make_source=None if source is None else lambda learner, mirror: source,
            ledger=CheckpointLedger(run, worker),
            # Before the ranks' last barrier, while the others still run (their CPU is read then).
            on_done=lambda learner, ranks: sink.measurement.stop(),
        )
        sink.measurement.stop()  # what follows is storing, not training
        if source is not None:
            summary.update(source.summary())
        sink.close()
    except BaseException:
        try:
            sink.close()  # what it logged before it failed
        except Exception:
            log.exception("run %s: the points still buffered could not be stored", run.pk)
        note_mirror(run, worker, mirror, succeeded=False)
        if source is not None:
            try:
                (folder / EXECUTION).write_text(json.dumps(source.summary()))
            except Exception:
                log.exception("run %s: no execution report for the failed attempt", run.pk)
        raise
    summary.update(measurement(run, sink, worker))
    note_mirror(run, worker, mirror, succeeded=True)
    return summary


if __name__ == "__main__":
    code = main(sys.argv[1:])  # a rank that raised has printed why and exits 1 the usual way
    from rlcore.distributed import end_process

    end_process(code)
