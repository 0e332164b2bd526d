"""Fixtures for the platform tests (their helpers are in support.py): settings for a test var/
folder, users and teams, queued experiments and runs (`make_experiment`, `make_run`, `run`), real
Celery worker processes that share the test database, a redis-server of a test's own
(`redis_server`) for broker outages, and headless Chromium pages.

The tests run against whatever `DATABASE_URL` / `REDIS_URL` say (CI: real PostgreSQL and
Redis) or, with neither set, against the embedded defaults (SQLite file, filesystem broker).
Every worker is a subprocess bounded by `timeout` and stopped at teardown, and trains with one
torch thread (`LAB_TORCH_THREADS=1`, and OpenMP/MKL told the same), as two cores are shared.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from urllib.parse import urlsplit, urlunsplit

import django
import pytest
from support import (
    CHROMIUM,
    CHROMIUM_ARGS,
    TEST_VAR,
    WORKER_THREADS,
    RedisServer,
    WorkerProcess,
    new_team_member,
    purge_queue,
    queue_sweep,
    stop_workers,
    summaries_disagreeing,
)

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

    def start(
        env: dict[str, str] | None = None, queue: str = "cpu", prefix: Sequence[str] = ()
    ) -> WorkerProcess:
        n = len(started)
        worker = WorkerProcess(
            {**worker_env, **(env or {})}, tmp_path / f"worker-{n}.log", f"test{n}", queue, prefix
        )
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
    """Drop the failed logins and token checks counted so far (accounts.throttle keeps them in
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
def team(db):
    """Team "team-a", whose one member is its admin alice (password "alice-password-1")."""
    return new_team_member("alice", "team-a").memberships.get().team


@pytest.fixture
def alice(team):
    return team.members.get(username="alice")


@pytest.fixture
def token(alice) -> str:
    """An API token of alice's, as `manage.py create_token alice` prints it."""
    import io

    from django.core.management import call_command

    out = io.StringIO()
    call_command("create_token", "alice", stdout=out)
    return out.getvalue().strip()


@pytest.fixture
def alice_client(client, alice):
    client.force_login(alice)
    return client


@pytest.fixture
def make_experiment(team, alice):
    """`make_experiment(name, config=…, presets=…, staleness=…, seeds=…)`: an experiment of alice's
    team queued through `sweeps.create_experiment` (`support.queue_sweep`; default one grpo run of
    `TINY_CONFIG`, seed 0)."""

    def make(name: str = "sweep", **sweep):
        return queue_sweep(team, alice, name, **sweep)

    return make


@pytest.fixture
def make_run(make_experiment):
    """`make_run(name, config=…, seed=…)`: the one queued run of a one-cell sweep (`make_experiment`)."""

    def make(name: str = "run", seed: int = 0, **sweep):
        return make_experiment(name, seeds=[seed], **sweep).runs.get()

    return make


@pytest.fixture
def run(make_run):
    """A queued grpo run of `TINY_CONFIG` in alice's team."""
    return make_run()


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


BROWSER_WAIT_MS = 90_000


@pytest.fixture
def page(browser, live_server, alice):
    """A headless Chromium page (a context of its own) logged in as alice on the live server."""
    from django.db import connections
    from django.urls import reverse

    (TEST_VAR / "screenshots").mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    page = context.new_page()
    # Every wait is for a condition (a selector, a URL, a function), capped so that a page that
    # never gets there fails: the cap is what a loaded machine needs (a CPU-bound process beside
    # the suite on two cores made a 20 s one run out), not what an idle one takes.
    page.set_default_timeout(BROWSER_WAIT_MS)
    page.goto(live_server.url + reverse("login"))
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", "alice-password-1")
    page.click("button[type=submit]")
    page.wait_for_url(live_server.url + reverse("experiment-list"))
    yield page
    context.close()
    # Code under Playwright's sync API runs in a greenlet with its own Django connections.
    connections.close_all()


# The folders whose tests break workers, brokers and databases on purpose (the chaos tests).
CHAOS_FOLDERS = {"workers", "execution"}


@pytest.fixture(autouse=True)
def summaries_agree_with_points(request) -> Iterator[None]:
    """A test of `CHAOS_FOLDERS` that used the database ends with each run's metric summaries
    agreeing with its points (`support.summaries_disagreeing`): one that loses a point, or
    counts one twice, fails even where it asserts nothing about metrics."""
    database = next((f for f in ("transactional_db", "db") if f in request.fixturenames), None)
    in_chaos_folder = request.node.path.parent.name in CHAOS_FOLDERS
    if not in_chaos_folder or (database is None and request.node.get_closest_marker("django_db") is None):
        yield
        return
    request.getfixturevalue(database or "db")  # set up first, so torn down after this check
    yield
    assert summaries_disagreeing() == []
