"""Mirroring: every run's config and metrics also sent to an MLflow tracking server and/or written
as TensorBoard event files under the run's folder, when its team or its sweep turns it on (off by
default; docs/imports.md, "Mirroring").

The worker wraps its `DatabaseSink` in a `MirroredSink` (`reporting`): the trainer still talks to a
sink and nothing else (rlcore never knows), the database still gets every point, and each point also
goes into one bounded queue per target, emptied by that target's own thread in batches. A target
that is slow or down never blocks nor fails the run: a batch is retried with backoff, then given
up (counted as failed, with the error); points that find the queue full are dropped (counted); at
the run's end each target has `CLOSE_S` seconds to send what is left. What each target sent, and
what it did not, goes on the run's notes (`finish`).

MLflow is spoken to through its REST API (`/api/2.0/mlflow/...`) with the standard library: the
run's MLflow experiment is `<team>/<experiment>` (created when missing), its MLflow run is found
again by the tag `lab.run_key` (a later attempt of the same run logs into the same MLflow run), its
params are its config flattened to dotted names, and each point is logged with its step and the
wall time the database stored for it (in milliseconds).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from datetime import datetime
from pathlib import Path
from typing import Any

from django.utils import timezone

from accounts.mirroring import settings_for
from experiments import packing

log = logging.getLogger(__name__)

QUEUE_POINTS = int(os.environ.get("LAB_MIRROR_QUEUE_POINTS", "20000"))  # per target
BATCH_POINTS = 1000  # MLflow's limit of metrics in one log-batch request
PARAMS_PER_BATCH = 100  # and of params
PARAM_VALUE_CHARS = 6000  # and of a param's value
REQUEST_TIMEOUT_S = float(os.environ.get("LAB_MIRROR_TIMEOUT_S", "5"))
RETRIES = 4  # tries of one batch before it is given up
BACKOFF_S = 0.25  # before the 2nd try; doubled before each next one
CLOSE_S = float(os.environ.get("LAB_MIRROR_CLOSE_S", "15"))  # at the run's end, to send what is left

# (metric name, step, value, wall time in µs since the epoch)
Point = tuple[str, int, float, int]


# ---------------------------------------------------------------------------------------------
# Targets


class Refused(Exception):
    """The target answered, and said no (an HTTP 4xx): trying the same again will not help."""


def flatten(config: Any, prefix: str = "") -> dict[str, str]:
    """A config as MLflow params: {"optimizer.lr": "1e-06", …}; lists and null as JSON."""
    if isinstance(config, dict) and config:
        out: dict[str, str] = {}
        for key, value in config.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    text = config if isinstance(config, str) else json.dumps(config)
    if len(text) > PARAM_VALUE_CHARS:
        text = text[: PARAM_VALUE_CHARS - 1] + "…"
    return {prefix[:-1]: text}


class MlflowTarget:
    """A run in an MLflow tracking server, through its REST API."""

    kind = "MLflow"

    def __init__(self, uri: str, experiment: str, run_name: str, run_key: str, tags: dict, params: dict):
        self.uri = uri.rstrip("/")
        self.where = f"MLflow at {self.uri}"
        self.experiment = experiment
        self.run_name = run_name
        self.run_key = run_key
        self.tags = tags
        self.params = params
        self.run_id: str | None = None
        self._params_sent = False

    def _call(self, path: str, body: dict | None = None, query: dict | None = None) -> dict:
        url = f"{self.uri}/api/2.0/mlflow/{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            url,
            data=data,
            method="GET" if body is None else "POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode(errors="replace")
            with contextlib.suppress(ValueError):
                answer = json.loads(detail)
                if isinstance(answer, dict):
                    detail = str(answer.get("message", detail))
            error = f"HTTP {exc.code} from {path}: {detail}"
            if 400 <= exc.code < 500 and exc.code not in (408, 429):
                if exc.code == 404 and path == "experiments/get-by-name":
                    return {}
                raise Refused(error) from exc
            raise ConnectionError(error) from exc

    def _experiment_id(self) -> str:
        found = self._call("experiments/get-by-name", query={"experiment_name": self.experiment})
        if found:
            return found["experiment"]["experiment_id"]
        try:
            return self._call("experiments/create", {"name": self.experiment})["experiment_id"]
        except Refused:  # created meanwhile by another run's mirror
            return self._call("experiments/get-by-name", query={"experiment_name": self.experiment})[
                "experiment"
            ]["experiment_id"]

    def _open(self) -> None:
        experiment_id = self._experiment_id()
        found = self._call(
            "runs/search",
            {
                "experiment_ids": [experiment_id],
                "filter": f"tags.`lab.run_key` = '{self.run_key}'",
                "max_results": 1,
            },
        ).get("runs", [])
        if found:
            self.run_id = found[0]["info"]["run_id"]
            self._call("runs/update", {"run_id": self.run_id, "status": "RUNNING"})
            return
        tags = [{"key": k, "value": str(v)} for k, v in {**self.tags, "lab.run_key": self.run_key}.items()]
        created = self._call(
            "runs/create",
            {
                "experiment_id": experiment_id,
                "run_name": self.run_name,
                "start_time": int(time.time() * 1000),
                "tags": tags,
            },
        )
        self.run_id = created["run"]["info"]["run_id"]

    def send(self, points: list[Point]) -> None:
        if self.run_id is None:
            self._open()
        if not self._params_sent:
            items = sorted(self.params.items())
            for i in range(0, len(items), PARAMS_PER_BATCH):
                params = [{"key": k, "value": v} for k, v in items[i : i + PARAMS_PER_BATCH]]
                try:
                    self._call("runs/log-batch", {"run_id": self.run_id, "params": params})
                except Refused as exc:
                    if "Changing param values is not allowed" not in str(exc):  # logged by an earlier attempt
                        raise
            self._params_sent = True
        metrics = [
            {"key": name, "value": _json_number(value), "timestamp": us // 1000, "step": step}
            for name, step, value, us in points
        ]
        self._call("runs/log-batch", {"run_id": self.run_id, "metrics": metrics})

    def end(self, succeeded: bool) -> None:
        if self.run_id is not None:
            status = "FINISHED" if succeeded else "FAILED"
            self._call(
                "runs/update", {"run_id": self.run_id, "status": status, "end_time": int(time.time() * 1000)}
            )

    def describe(self) -> str:
        return f"{self.where} (experiment {self.experiment!r}, run {self.run_id or 'not created'})"


def _json_number(value: float) -> float | str:
    """MLflow's JSON takes NaN and ±Infinity as strings."""
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


class TensorBoardTarget:
    """A TensorBoard event file in the run's folder (`Run.tensorboard_dir`), one per attempt,
    appended to batch by batch (`imports.tfevents.write_scalars`: float32 `simple_value` scalars,
    as torch's `SummaryWriter` writes them)."""

    kind = "TensorBoard"

    def __init__(self, folder: Path):
        from imports.tfevents import event_file_name

        self.folder = folder
        self.path = folder / event_file_name()
        self.where = f"TensorBoard event file {self.path}"

    def send(self, points: list[Point]) -> None:
        from imports.formats.base import Point as Scalar
        from imports.tfevents import write_scalars

        self.folder.mkdir(parents=True, exist_ok=True)
        write_scalars(self.path, [Scalar(step, name, value, us / 1e6) for name, step, value, us in points])

    def end(self, succeeded: bool) -> None:
        """Nothing to close: each batch was complete when written."""

    def describe(self) -> str:
        return self.where


# ---------------------------------------------------------------------------------------------
# The queue and the thread of one target


class Outlet:
    """One target's bounded queue and the thread that empties it."""

    def __init__(self, target, capacity: int = QUEUE_POINTS):
        self.target = target
        self.capacity = capacity
        self._queue: deque[Point] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._deadline = math.inf
        self._down = False  # its last batch was given up
        self.offered = self.sent = self.dropped = self.failed = self.in_flight = 0
        self.error = ""
        self._thread = threading.Thread(target=self._loop, name=f"mirror-{target.kind}", daemon=True)
        self._thread.start()

    def put(self, points: list[Point]) -> None:
        """Never waits for the target: what does not fit in the queue is dropped (counted)."""
        with self._cond:
            self.offered += len(points)
            room = self.capacity - len(self._queue)
            if room < len(points):
                self.dropped += len(points) - max(room, 0)
                points = points[: max(room, 0)]
            self._queue.extend(points)
            self._cond.notify()

    def _take(self) -> list[Point] | None:
        """The next batch; None once closing and the queue is empty, the time to close is up, or
        the target failed its last batch (it is down: the run's end does not wait for it)."""
        with self._cond:
            while not self._queue and not self._closing:
                self._cond.wait()
            if not self._queue or (self._closing and (self._down or time.monotonic() >= self._deadline)):
                return None
            batch = [self._queue.popleft() for _ in range(min(BATCH_POINTS, len(self._queue)))]
            self.in_flight = len(batch)
            return batch

    def _loop(self) -> None:
        while (batch := self._take()) is not None:
            delay = BACKOFF_S
            for attempt in range(1, RETRIES + 1):
                try:
                    self.target.send(batch)
                except Exception as exc:
                    with self._cond:
                        self.error = f"{type(exc).__name__}: {exc}"
                        wait = min(delay, max(self._deadline - time.monotonic(), 0))
                    if attempt < RETRIES and not isinstance(exc, Refused) and wait > 0:
                        time.sleep(wait)  # the run's end cuts the waiting short
                        delay *= 2
                        continue
                    log.warning(
                        "%s: %d points not mirrored: %s", self.target.describe(), len(batch), self.error
                    )
                    with self._cond:
                        self.failed += len(batch)
                        self.in_flight = 0
                        self._down = True
                else:
                    with self._cond:
                        self.sent += len(batch)
                        self.in_flight = 0
                        self._down = False
                break

    def close(self, succeeded: bool, within_s: float = CLOSE_S) -> None:
        """Send what is left within `within_s` seconds, then stop; end the target's run."""
        started = time.monotonic()
        with self._cond:
            self._closing = True
            self._deadline = started + within_s
            self._cond.notify()
        self._thread.join(within_s + REQUEST_TIMEOUT_S)
        if self.sent and time.monotonic() < started + within_s + REQUEST_TIMEOUT_S:
            try:
                self.target.end(succeeded)
            except Exception as exc:
                log.warning("%s: the run's end not recorded: %s", self.target.describe(), exc)

    def report(self) -> str:
        """A sentence for the run's notes: where, what was sent, and what was not and why."""
        with self._cond:
            left = len(self._queue) + self.in_flight
            missing = self.offered - self.sent
            where = self.target.describe()
            if not missing:
                return f"Mirrored to {where}: all {self.sent} points."
            parts = []
            if self.dropped:
                parts.append(f"{self.dropped} dropped while its queue was full ({self.capacity} points)")
            if self.failed:
                parts.append(f"{self.failed} given up after {RETRIES} tries")
            if left:
                parts.append(f"{left} still unsent when the run ended")
            error = f" Last error: {self.error}" if self.error else ""
            return (
                f"Mirroring to {where} incomplete: {self.sent} of {self.offered} points sent, "
                f"{missing} not mirrored ({'; '.join(parts)}).{error}"
            )


class Mirror:
    """A run's targets, each behind its own `Outlet`."""

    def __init__(self, targets: list, capacity: int = QUEUE_POINTS):
        self.outlets = [Outlet(target, capacity) for target in targets]

    def log(self, step: int, metrics: dict[str, float], at: datetime) -> None:
        us = packing.micros(at)
        points = [(name, step, float(value), us) for name, value in metrics.items()]
        for outlet in self.outlets:
            outlet.put(points)

    def close(self, succeeded: bool, within_s: float = CLOSE_S) -> list[str]:
        """Send what is left (every target within the same `within_s` seconds); one sentence per
        target for the run's notes."""
        threads = [
            threading.Thread(target=outlet.close, args=(succeeded, within_s), daemon=True)
            for outlet in self.outlets
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return [outlet.report() for outlet in self.outlets]


class MirroredSink:
    """The worker's sink with a mirror beside it: everything goes to `inner` as before, and each
    point also to the mirror, with the wall time the database stores for it."""

    def __init__(self, inner, mirror: Mirror):
        self.inner = inner
        self.mirror = mirror

    def log(self, step: int, metrics: dict[str, float]) -> None:
        now = timezone.now()
        self.inner.log(step, metrics, at=now)
        try:
            self.mirror.log(step, metrics, now)
        except Exception:  # never the run's problem
            log.exception("mirroring step %s failed", step)

    def sample(self, step, samples) -> None:
        self.inner.sample(step, samples)

    def should_stop(self) -> bool:
        return self.inner.should_stop()

    def flush(self) -> None:
        self.inner.flush()

    def phase(self, name: str, **details: float) -> None:
        self.inner.phase(name, **details)

    def provenance(self, record: dict[str, object]) -> None:
        self.inner.provenance(record)

    def note(self, text: str) -> None:
        self.inner.note(text)


# ---------------------------------------------------------------------------------------------
# The worker's two calls


def mirror_for(run) -> Mirror | None:
    """The run's mirror, None when its team and sweep leave mirroring off (or when its settings
    cannot be read: logged, and the run goes on unmirrored)."""
    try:
        experiment = run.experiment
        team = experiment.team
        chosen = settings_for(team, experiment.spec)
        if not chosen.on:
            return None
        targets: list = []
        if chosen.mlflow_uri:
            targets.append(
                MlflowTarget(
                    chosen.mlflow_uri,
                    experiment=f"{team.name}/{experiment.name}",
                    run_name=f"run {run.pk}: {run.line}, {run.staleness}, seed {run.seed}",
                    run_key=str(run.key),
                    tags={
                        "lab.run": run.pk,
                        "lab.experiment": experiment.pk,
                        "lab.team": team.name,
                        "lab.preset": run.preset,
                        "lab.staleness": run.staleness,
                        "lab.seed": run.seed,
                    },
                    params=flatten(run.config),
                )
            )
        if chosen.tensorboard:
            targets.append(TensorBoardTarget(run.tensorboard_dir))
        return Mirror(targets)
    except Exception:
        log.exception("run %s: its mirror could not be set up; it goes unmirrored", run.pk)
        return None


def reporting(run, sink) -> tuple[Any, Mirror | None]:
    """What the trainer reports through (`sink`, mirrored when the run is), and the mirror."""
    mirror = mirror_for(run)
    return (sink if mirror is None else MirroredSink(sink, mirror)), mirror


def finish(run, mirror: Mirror | None, succeeded: bool) -> list[str]:
    """At the run's end, before its status changes: send what is left; what each target got, a
    sentence each for the run's notes ([] without a mirror). Never raises: a mirror never fails a
    run."""
    if mirror is None:
        return []
    try:
        return mirror.close(succeeded)
    except Exception as exc:
        log.exception("run %s: its mirror could not be closed", run.pk)
        return [f"Mirroring could not be finished: {type(exc).__name__}: {exc}"]
