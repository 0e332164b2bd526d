"""The sink a worker hands to `rlcore.trainer.train`: metrics, completions, the phase and the
heartbeat into the database, written in batches by a background thread (`flush()` writes at once,
before every checkpoint); a step logged again replaces its point (`experiments.series`), so a re-executed step never doubles one. Every call
rides out a short outage; what cannot be stored stops the run with the reason (`StoringFailed`).
`CheckpointLedger` keeps each checkpoint's sha256 in the database. A worker that no longer owns
the run (reaped after a stall, the run re-queued and taken by another) writes nothing more: every
write goes in under `Run.hold`, the heartbeat's lock."""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime

from django.db import close_old_connections, connection, transaction
from django.utils import timezone

from experiments import packing, series
from experiments.models import Checkpoint, Completion, RolloutJob, Run
from experiments.text import storable
from rlcore.sinks import TRAINING, Sample
from workers.db_outage import UNREACHABLE, retry_db
from workers.measure import Measurement

FLUSH_INTERVAL_S = 0.5

log = logging.getLogger(__name__)


class StoringFailed(RuntimeError):
    """The database refused what the run reported (not an outage): the run cannot go on."""


class NotOwner(RuntimeError):
    """The run is no longer this worker's: what it would write now is dropped, and it stops."""


class DatabaseSink:
    """Buffers what the trainer reports and flushes it to the database from a thread."""

    def __init__(self, run: Run, worker: str, measurement: Measurement | None = None):
        self.run = run
        self.worker = worker
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._points: dict[tuple[str, int], tuple[float, datetime]] = {}
        self._series = series.Writer(run.pk)
        self._samples: dict[int, list[Sample]] = {}
        self._progress = run.progress
        self._latest = -1  # the newest step logged in this attempt
        self._phase = ""
        self._phase_detail: dict = {}
        # {"from_step", "from", "to_step", "to"}: steps done and when (Unix time) in this attempt.
        self._timing: dict[str, float] = {}
        self.measurement = measurement or Measurement()  # what this attempt costs, phase by phase
        self._closing = threading.Event()
        self._refused: Exception | None = None  # the database refused a flush (not an outage)
        self._thread = threading.Thread(target=self._flush_loop, name=f"flush-run-{run.pk}", daemon=True)
        self._thread.start()

    def log(self, step: int, metrics: dict[str, float], at: datetime | None = None) -> None:
        """`at`: the points' wall time (now by default; a mirror passes the time it sends)."""
        now = at or timezone.now()
        with self._lock:
            for name, value in metrics.items():
                self._points[(name, step)] = (float(value), now)
            if step < self._latest:
                return  # an evaluation that came back from a rollout worker: progress stays
            self._latest = self._progress = step
            if step > 0:
                self.measurement.step(step, metrics)
            if step > 0 and self._timing:
                self._timing.update(to_step=step, to=time.time())

    def provenance(self, record: dict[str, object]) -> None:
        """Stored on the run before anything is logged; refuses a θ0 other than the experiment's."""
        retry_db(self.run.record_provenance)(self.worker, record)

    def phase(self, name: str, **details: float) -> None:
        with self._lock:
            if name != self._phase or name == TRAINING:
                self.measurement.phase(name, details.get("step"))
            if name == TRAINING and not self._timing:
                # The first step of this attempt starts now: as if its previous step had just ended.
                now = time.time()
                self._timing = {
                    "from_step": details["step"] - 1,
                    "from": now,
                    "to_step": details["step"] - 1,
                    "to": now,
                }
            self._phase, self._phase_detail = name, details

    def sample(self, step: int, samples: list[Sample]) -> None:
        with self._lock:
            self._samples.setdefault(step, []).extend(samples)

    def note(self, text: str) -> None:
        """Written at once: a note is rare and says something about this attempt."""
        retry_db(self.run.add_note)(self.worker, text)

    def should_stop(self) -> bool:
        """Raises `StoringFailed` once a flush was refused for good."""
        if self._refused is not None:
            raise StoringFailed(f"the database refused the run's metrics: {self._refused}") from self._refused
        return retry_db(self.run.stop_requested)(self.worker)

    @retry_db
    def flush(self) -> None:
        """Write everything buffered so far and beat the heartbeat (the trainer calls it right
        before each checkpoint)."""
        with self._flush_lock:
            self._write()

    def _write(self) -> None:
        with self._lock:
            points, self._points = self._points, {}
            samples, self._samples = self._samples, {}
            progress = self._progress
            phase = self._phase
            detail = {**self._phase_detail, **({"timing": dict(self._timing)} if self._timing else {})}
        try:
            with transaction.atomic():
                # The heartbeat's UPDATE locks the run's row until commit: once the run is no longer
                # this worker's (reaped, re-queued), what it still reports is dropped, not mixed in.
                if not self.run.beat(self.worker, progress, phase, detail):
                    return
                self._series.write(
                    (name, step, value, wall) for (name, step), (value, wall) in points.items()
                )
                if samples:
                    Completion.objects.filter(run=self.run, step__in=list(samples)).delete()
                Completion.objects.bulk_create(
                    Completion(
                        run=self.run,
                        step=step,
                        prompt=storable(s.prompt),
                        completion=storable(s.completion),
                        reward=packing.finite_or_none(s.reward),
                    )
                    for step, batch in samples.items()
                    for s in batch
                )
        except Exception:
            # Keep what was not written (newer values win) and try again on the next tick.
            self._series.forget()
            with self._lock:
                for key, value in points.items():
                    self._points.setdefault(key, value)
                for step, batch in samples.items():
                    self._samples.setdefault(step, batch)
            raise
        else:
            self._series.committed()

    def _flush_loop(self) -> None:
        try:
            while not self._closing.wait(FLUSH_INTERVAL_S):
                try:
                    self.flush()
                except Exception as exc:
                    log.exception("run %s: flushing metrics failed; retrying", self.run.pk)
                    if not isinstance(exc, UNREACHABLE):
                        self._refused = exc
                    close_old_connections()
        finally:
            connection.close()

    def close(self) -> None:
        """Stop the flush thread, write what is left and pack the run's newest chunks (from the
        calling thread), while the run is still this worker's."""
        self._closing.set()
        self._thread.join()
        self.flush()
        retry_db(self._seal)()
        self._series.forget()

    def _seal(self) -> None:
        with transaction.atomic():
            if self.run.hold(self.worker):
                series.seal(self.run.pk)
            else:
                log.warning(
                    "run %s is no longer %s's: its chunks are left to its owner", self.run.pk, self.worker
                )


class CheckpointLedger:
    """The sha256 of each of a run's checkpoints, in the database (`rlcore.checkpoints.Ledger`),
    recorded by the worker that executes the run only."""

    def __init__(self, run: Run, worker: str):
        self.run = run
        self.worker = worker

    @retry_db
    def record(self, step: int, sha256: str, size_bytes: int) -> None:
        """Raises `NotOwner` (nothing recorded, and `checkpoints.save` keeps the file out of the
        run's folder) once the run is no longer this worker's."""
        with transaction.atomic():
            if not self.run.hold(self.worker):
                raise NotOwner(
                    f"run {self.run.pk} is no longer executed by {self.worker}: "
                    f"its checkpoint of step {step} is not kept"
                )
            Checkpoint.objects.update_or_create(
                run=self.run, step=step, defaults={"sha256": sha256, "size_bytes": size_bytes}
            )

    @retry_db
    def sha256(self, step: int) -> str | None:
        return Checkpoint.objects.filter(run=self.run, step=step).values_list("sha256", flat=True).first()


def measurement(run: Run, sink: DatabaseSink, worker: str) -> dict[str, float]:
    """What the attempt cost (`workers.measure`), with the CPU time of its rollout jobs; nothing
    (logged) if that cannot be read: a run that trained is never failed for its measurement."""
    measured = sink.measurement
    try:
        return measured.report(retry_db(RolloutJob.cpu_rows)(run, measured.started_at, worker))
    except Exception:
        log.exception("run %s: its measurement could not be made; its summary goes without", run.pk)
        return {}


def note_mirror(run: Run, worker: str, mirror, succeeded: bool) -> None:
    """Send what the run's mirror (`imports.mirror`, None when it has none) still holds and note on
    the run what each target got; a mirror never fails a run, nor does its note."""
    from imports import mirror as mirrors

    for text in mirrors.finish(run, mirror, succeeded):
        try:
            retry_db(run.add_note)(worker, text)
        except Exception:
            log.exception("run %s: the mirror's note could not be written: %s", run.pk, text)
