"""What the platform tests share besides fixtures: the test var/ folder, the tiny run config,
polling, process groups, broker queues, Redis and worker processes (`WorkerProcess`, which the
benchmarks' `bench/lab_workers.py` starts its workers with too), Chromium's flags, and
`queue_sweep`, the one way tests queue an experiment (the `make_experiment` / `make_run` / `run`
fixtures of conftest.py are built on it)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
TEST_VAR = REPO / "var" / "test"

WORKER_LIMIT_S = 600


READY_TIMEOUT_S = 90


WORKER_THREADS = "1"


# A run of a few seconds on 2 cores: the tiny model, small batches, frequent checkpoints.
TINY_CONFIG = {
    "model": {
        "tiny": {
            "hidden_size": 32,
            "num_layers": 1,
            "num_heads": 2,
            "intermediate_size": 64,
            "warmstart_max_steps": 50,
        }
    },
    "rollout": {"group_size": 4, "prompts_per_step": 4},
    "steps": 6,
    "eval_every": 5,
    "eval_size": 20,
    "checkpoint_every": 2,
    "samples_per_step": 2,
    "device": "cpu",
}


def wait_for(predicate: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.2):
    """Poll `predicate` until it returns something truthy; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")


def wait_for_log(worker, text: str, timeout_s: float = 60) -> None:
    """Wait for `text` in `worker`'s log. A worker logs what it did after committing it (a task's
    result line, `run N attempt A: succeeded`, the reaper's `lost`), so a test that saw the
    database change waits for the line."""
    wait_for(lambda: text in worker.log(), timeout_s, f"{text!r} in the worker's log")


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_group(proc: subprocess.Popen, sig: int, timeout_s: float) -> str:
    """Send `sig` to the process group `proc` leads and wait up to `timeout_s` for all of it to end.

    Returns "" when it did, else the `ps` lines of what was left, which is then SIGKILLed, so
    no test leaves a process behind.
    """
    if group_alive(proc.pid):
        os.killpg(proc.pid, sig)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None and not group_alive(proc.pid):
            return ""
        time.sleep(0.2)
    leftover = subprocess.run(
        ["ps", "-o", "pid,ppid,stat,etime,args", "-g", str(proc.pid)], capture_output=True, text=True
    ).stdout
    if group_alive(proc.pid):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return leftover


def queued_messages(queue: str = "cpu") -> int:
    """Messages waiting in the broker queue (nothing consumes them while no worker runs)."""
    from lab.celery import app

    with app.connection_for_write() as conn:
        return conn.default_channel.queue_declare(queue=queue, passive=False).message_count


def purge_queue(queue: str = "cpu") -> None:
    from lab.celery import app

    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge(queue)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def use_broker(url: str) -> Iterator[None]:
    """Point this process's Celery app (what the pages and the API send with) at `url` meanwhile."""
    from lab.celery import app

    def switch(to: str) -> None:
        # kombu keeps one connection pool per broker URL for the process: switching back finds
        # the old one again, so it is left open.
        app.conf.broker_url = to
        app._pool = None
        app.amqp._producer_pool = None

    before = app.conf.broker_url
    switch(url)
    try:
        yield
    finally:
        switch(before)


class RedisServer:
    """`redis-server` on a free loopback port, keeping nothing on disk (a restart loses every
    message, like a Redis without persistence); bounded by `timeout`, in its own process group."""

    def __init__(self, log_path: Path):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._log = log_path.open("a")
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                *f"timeout -s KILL {WORKER_LIMIT_S} redis-server --port {self.port} --bind 127.0.0.1".split(),
                *("--save", "", "--appendonly", "no"),
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(self.ping, 60, f"redis-server on port {self.port}")

    def ping(self) -> bool:
        import redis

        try:
            return redis.Redis(port=self.port, socket_connect_timeout=1).ping()
        except redis.ConnectionError:
            return False

    def kill(self) -> None:
        """SIGKILL: the server goes away at once, and every message with it."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc, signal.SIGTERM, timeout_s=10)
        self._log.close()


class WorkerProcess:
    """`celery -A workers worker -Q cpu` (or another queue) in its own process group, logging to a
    file, killed after `limit_s`; `prefix` goes before the command (e.g. `PID_ONE`). Returns once
    the worker says it is ready. The tests' workers (conftest.py) and the benchmarks'
    (`bench/lab_workers.py`) are started this one way."""

    def __init__(
        self,
        env: dict[str, str],
        log_path: Path,
        name: str,
        queue: str = "cpu",
        prefix: Sequence[str] = (),
        limit_s: int = WORKER_LIMIT_S,
    ):
        from lab.celery import worker_command

        self.log_path = log_path
        self._log = log_path.open("w")
        self.proc = subprocess.Popen(
            ["timeout", "-s", "KILL", str(limit_s), *prefix, *worker_command(queue, f"{name}@%h")],
            cwd=REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        match = wait_for(self._ready, READY_TIMEOUT_S, f"worker {name} to start (log: {log_path})")
        self.identity, self.system = match.group(1), match.group(2)

    def log(self) -> str:
        return self.log_path.read_text()

    def _ready(self):
        if self.proc.poll() is not None:
            pytest.fail(f"worker exited with {self.proc.returncode}:\n{self.log()}")
        return re.search(r"worker (\S+) ready on (\S+)", self.log())

    def kill(self) -> None:
        """SIGKILL the worker: no warm shutdown, no acknowledgement, no last heartbeat."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        """Teardown: SIGKILL, as `kill`. The test is over, and a warm shutdown takes 3–6 s even
        for an idle worker (longer for one still in a run), dozens of times per suite."""
        stop_group(self.proc, signal.SIGKILL, timeout_s=10)
        self._log.close()


# Run a command as PID 1 of a new PID namespace, as a container's main process is.
PID_ONE = (
    ["unshare", "--pid", "--fork", "--mount-proc"]
    if os.geteuid() == 0
    else ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"]
)


def stop_workers(workers: list[WorkerProcess]) -> None:
    """Teardown: SIGKILL every worker at once, then wait for each (a group takes 1-2 s to go)."""
    for w in workers:
        if group_alive(w.proc.pid):
            os.killpg(w.proc.pid, signal.SIGKILL)
    for w in workers:
        w.stop()


# Debian's Chromium, never a downloaded browser; only the live server on 127.0.0.1, so no
# update checks or other background traffic.
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


def queue_sweep(
    team,
    owner,
    name: str = "sweep",
    *,
    config: dict[str, Any] | None = None,
    presets: Sequence[str] = ("grpo",),
    staleness: Sequence[dict[str, Any]] = ({},),
    seeds: Sequence[int] = (0,),
    description: str = "",
    mirror: dict[str, Any] | None = None,
):
    """Queue the experiment of a sweep as the form and the API do (`sweeps.create_experiment`):
    `config` (default `TINY_CONFIG`) crossed with `presets` × `staleness` × `seeds`, mirrored
    where `mirror` says (`imports.mirror`)."""
    from experiments.sweeps import create_experiment, expand

    grid = expand(
        TINY_CONFIG if config is None else config, list(presets), list(staleness), list(seeds), mirror=mirror
    )
    return create_experiment(team, owner, name, description, grid)


def new_team_member(username: str, team: str, is_admin: bool = True):
    """A new user `username` (password `<username>-password-1`) in a new team `team`."""
    from django.contrib.auth import get_user_model

    from accounts.models import Membership, Team

    user = get_user_model().objects.create_user(username, password=f"{username}-password-1")
    Membership.objects.create(team=Team.objects.create(name=team), user=user, is_admin=is_admin)
    return user


def start_web(env: dict[str, str], port: int, log, limit_s: int = WORKER_LIMIT_S) -> subprocess.Popen:
    """The web server as `make up` starts it (`up.web_command`) on 127.0.0.1:`port`, in its own
    process group, bounded by `timeout`, writing to the open file `log`."""
    from lab.management.commands.up import web_command

    return subprocess.Popen(
        ["timeout", "-s", "KILL", str(limit_s), *web_command("127.0.0.1", port)],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def log_points(run, points) -> None:
    """Store (name, step, value, wall time) points of `run` as the worker's sink does
    (`experiments.series.Writer`, in a transaction)."""
    from django.db import transaction

    from experiments import series

    with transaction.atomic():
        series.Writer(getattr(run, "pk", run)).write(points)


def logged(run, name: str = "") -> list[tuple[str, int, float | None]]:
    """(name, step, value) of every point `run` logged (or of metric `name`), in name and step
    order; a value that is not finite is None, as the pages and the API show it."""
    from experiments import series

    return [
        (metric, step, series.shown(value))
        for metric, (steps, values, _) in series.points_of(getattr(run, "pk", run), name)
        for step, value in zip(steps.tolist(), values.tolist(), strict=True)
    ]


def last_step(run, name: str) -> int | None:
    """The last step `run` logged of metric `name` (from its summary), None if none."""
    from experiments.models import MetricSummary

    return MetricSummary.objects.filter(run=run, name=name).values_list("last_step", flat=True).first()


def summaries_disagreeing(run_ids=None) -> list[str]:
    """Where a run's stored metric summaries and its points disagree (every run's, or `run_ids`'):
    a summary with no points or points with no summary, or a summary field other than the one a
    fresh `packing.summarise` of the points gives. [] when they all agree."""
    import math

    import numpy as np

    from experiments import packing, series
    from experiments.models import MetricSummary, Run

    runs = Run.objects.all() if run_ids is None else Run.objects.filter(pk__in=run_ids)
    problems = []
    for run_id in runs.values_list("pk", flat=True):
        points = dict(series.points_of(run_id))
        summaries = series.stored_summaries(
            run_id, MetricSummary.objects.filter(run_id=run_id).values_list("name", flat=True)
        )
        for name in sorted(points.keys() ^ summaries.keys()):
            problems.append(f"run {run_id} {name}: {'points' if name in points else 'a summary'} only")
        for name in sorted(points.keys() & summaries.keys()):
            steps, values, _ = points[name]
            want, got = packing.summarise(steps, values), summaries[name]
            for field in packing.SUMMARY_FIELDS:
                a, b = got[field], want[field]
                if field == "tail":
                    same = np.allclose(a, b, rtol=1e-12, equal_nan=True) if len(a) == len(b) else False
                elif isinstance(a, float) and isinstance(b, float):
                    same = math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) or (math.isnan(a) and math.isnan(b))
                else:
                    same = a == b
                if not same:
                    problems.append(f"run {run_id} {name}: {field} is {a!r}, its points say {b!r}")
    return problems


def sweep_form(
    team, name: str, presets: list[str] | None = None, seeds: str = "0", fields: dict | None = None
) -> dict:
    """What the new-sweep form posts for a sweep called `name` in `team`: `presets` (grpo) on
    policy, `seeds`, and the form's other `fields` (dotted names, as the form's inputs are named)."""
    return {
        "name": name,
        "team": team.pk,
        "presets": presets or ["grpo"],
        "on_policy": "on",
        "seeds": seeds,
        **(fields or {}),
    }
