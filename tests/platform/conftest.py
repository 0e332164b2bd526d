"""Fixtures for the platform tests: settings for a test var/ folder, users and teams, real
Celery worker processes that share the test database, and a redis-server of a test's own
(`redis_server`, with `use_broker` pointing this process's Celery app at it) for broker outages.

The tests run against whatever `DATABASE_URL` / `REDIS_URL` say (CI: real PostgreSQL and
Redis) or, with neither set, against the embedded defaults (SQLite file, filesystem broker).
Every worker is a subprocess bounded by `timeout` and stopped at teardown, and trains with one
torch thread (`LAB_TORCH_THREADS=1`, and OpenMP/MKL told the same), as two cores are shared.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import django
import pytest

REPO = Path(__file__).resolve().parents[2]
TEST_VAR = REPO / "var" / "test"
os.environ["LAB_VAR_DIR"] = str(TEST_VAR)
os.environ["LAB_DATA_ROOTS"] = str(TEST_VAR / "data")
os.environ["LAB_HEARTBEAT_TIMEOUT_S"] = "3"
os.environ["LAB_REAP_INTERVAL_S"] = "1"
os.environ["LAB_DISPATCH_INTERVAL_S"] = "1"
os.environ["LAB_DISPATCH_GRACE_S"] = "2"
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lab.settings")
django.setup()  # this conftest is not an initial one, so pytest-django has not set Django up yet

from django.conf import settings  # noqa: E402

# The default hasher (PBKDF2, over a million rounds) takes ~0.6 s a password on these cores and
# most tests create a user or log one in: tests hash with a fast one. Worker and `manage.py`
# subprocesses keep the default.
settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

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
        wait_for(self.ping, 20, f"redis-server on port {self.port}")

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


@pytest.fixture
def redis_server(tmp_path) -> Iterator[RedisServer]:
    """A started redis-server of this test's own; stopped at teardown."""
    if not os.environ.get("REDIS_URL"):
        pytest.skip("the tests run with the filesystem broker (no REDIS_URL): there is no Redis to take down")
    server = RedisServer(tmp_path / "redis.log")
    try:
        server.start()
        yield server
    finally:
        server.stop()


class WorkerProcess:
    """`celery -A workers worker -Q cpu` (or another queue) in its own process group, logging to a file."""

    def __init__(self, env: dict[str, str], log_path: Path, name: str, queue: str = "cpu"):
        from lab.celery import worker_command

        self.log_path = log_path
        self._log = log_path.open("w")
        self.proc = subprocess.Popen(
            ["timeout", "-s", "KILL", str(WORKER_LIMIT_S), *worker_command(queue, f"{name}@%h")],
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


def stop_workers(workers: list[WorkerProcess]) -> None:
    """Teardown: SIGKILL every worker at once, then wait for each (a group takes 1-2 s to go)."""
    for w in workers:
        if group_alive(w.proc.pid):
            os.killpg(w.proc.pid, signal.SIGKILL)
    for w in workers:
        w.stop()


def _test_database_url() -> str:
    from django.db import connection

    settings = connection.settings_dict
    if settings["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{settings['NAME']}"
    parts = urlsplit(os.environ["DATABASE_URL"])
    return urlunsplit(parts._replace(path="/" + settings["NAME"]))


@pytest.fixture(scope="session")
def worker_env(django_db_setup, django_db_blocker) -> dict[str, str]:
    """The environment of a worker process: same settings, pointed at the test database, one thread."""
    with django_db_blocker.unblock():
        url = _test_database_url()
    shutil.rmtree(TEST_VAR / "runs", ignore_errors=True)
    (TEST_VAR / "data").mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        "DATABASE_URL": url,
        "PYTHONUNBUFFERED": "1",
        "LAB_TORCH_THREADS": WORKER_THREADS,
        "OMP_NUM_THREADS": WORKER_THREADS,
        "MKL_NUM_THREADS": WORKER_THREADS,
    }


@pytest.fixture
def start_worker(worker_env, tmp_path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start workers on demand, optionally with changes to `worker_env`; all are stopped at teardown."""
    started: list[WorkerProcess] = []

    def start(env: dict[str, str] | None = None, queue: str = "cpu") -> WorkerProcess:
        n = len(started)
        worker = WorkerProcess({**worker_env, **(env or {})}, tmp_path / f"worker-{n}.log", f"test{n}", queue)
        started.append(worker)
        return worker

    for queue in ("cpu", "rollout"):
        purge_queue(queue)
    yield start
    stop_workers(started)


@pytest.fixture(scope="module")
def worker(worker_env, tmp_path_factory) -> Iterator[WorkerProcess]:
    """One worker for a whole module (importing torch and warm-starting the tiny model is slow)."""
    purge_queue()
    process = WorkerProcess(worker_env, tmp_path_factory.mktemp("worker") / "worker.log", "module")
    yield process
    process.stop()


def forget_rate_limit_counts() -> None:
    """Drop the failed logins and token checks counted so far (experiments.throttle keeps them in
    the cache for LAB_RATE_WINDOW_S, across tests and test runs)."""
    from django.conf import settings
    from django.core.cache import cache

    if settings.REDIS_URL:
        client = cache._cache.get_client(write=True)
        keys = list(client.scan_iter(match=cache.make_key("throttle:*")))
        if keys:
            client.delete(*keys)
    else:
        cache.clear()


@pytest.fixture(autouse=True)
def no_rate_limit_counts() -> Iterator[None]:
    forget_rate_limit_counts()
    yield
    forget_rate_limit_counts()


@pytest.fixture
def team(django_user_model):
    from experiments.models import Membership, Team

    user = django_user_model.objects.create_user("alice", password="alice-password-1")
    team = Team.objects.create(name="team-a")
    Membership.objects.create(team=team, user=user, is_admin=True)
    return team


@pytest.fixture
def alice(team):
    return team.members.get(username="alice")


@pytest.fixture
def alice_client(client, alice):
    client.force_login(alice)
    return client


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


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium per test module (launching it costs ~2 s; each test gets a fresh
    context, so no cookies or storage cross tests)."""
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop in this thread while the browser lives; the
    # module's tests still call the ORM synchronously.
    unsafe = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as p:
            launched = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield launched
            launched.close()
    finally:
        if unsafe is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = unsafe


@pytest.fixture
def page(browser, live_server, alice):
    """A headless Chromium page (a context of its own) logged in as alice on the live server."""
    from django.db import connections
    from django.urls import reverse

    (TEST_VAR / "screenshots").mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(20_000)
    page.goto(live_server.url + reverse("login"))
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", "alice-password-1")
    page.click("button[type=submit]")
    page.wait_for_url(live_server.url + reverse("experiment-list"))
    yield page
    context.close()
    # Code under Playwright's sync API runs in a greenlet with its own Django connections.
    connections.close_all()
