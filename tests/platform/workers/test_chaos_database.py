"""Chaos: PostgreSQL stopped for 20 s in the middle of two runs at once: a simulated run and an
async run whose batches a rollout worker makes. The workers wait and retry their database calls
(workers/db_outage.py), so each run succeeds on its first attempt with every metric point, each
(name, step) exactly once, and every rollout job is done on its first attempt. Meanwhile the web
server answers the API and `/health` with 503 and Retry-After, never 500.

The test starts its own PostgreSQL server (initdb into a temporary folder, listening on a free
port of 127.0.0.1 only, trust authentication) so that it can stop and start it without touching
the database other tests use. Everything that talks to that server runs in subprocesses
(`manage.py migrate`, `manage.py shell` to submit the runs, real Celery workers: one training
worker per run and a rollout worker); the test reads the results with psycopg. The broker is the
one the other tests use. Every process it starts is stopped at teardown, even on failure.
"""

from __future__ import annotations

import collections
import contextlib
import glob
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from support import (
    REPO,
    TINY_CONFIG,
    WORKER_THREADS,
    WorkerProcess,
    free_port,
    purge_queue,
    start_web,
    stop_group,
    stop_workers,
    wait_for,
)

from rlcore.sinks import STEP_METRICS

OUTAGE_S = 20
COMMAND_TIMEOUT_S = 120


def _server_bin_dir() -> Path | None:
    """The newest PostgreSQL server binaries: Debian's /usr/lib/postgresql/N/bin, else the PATH."""
    found = sorted(
        (Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin") if Path(p, "initdb").exists()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    if found:
        return found[-1]
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class PrivatePostgres:
    """A PostgreSQL server of this test's own: its data folder, port and socket folder.

    initdb and postgres refuse to run as root, so as root they run as the `postgres` OS user.
    """

    def __init__(self, bin_dir: Path, base: Path, as_user: list[str]):
        self.bin_dir, self.base, self.as_user = bin_dir, base, as_user
        self.data = base / "data"
        self.log = base / "postgres.log"
        self.port = free_port()

    def _pg(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*self.as_user, str(self.bin_dir / args[0]), *args[1:]],
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )

    def init(self) -> str:
        """Create the cluster; "" when it worked, else why not."""
        done = self._pg("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync")
        return "" if done.returncode == 0 else f"initdb failed: {done.stderr.strip() or done.stdout.strip()}"

    def start(self) -> str:
        options = f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 -c fsync=off"
        done = self._pg(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60", "start"
        )
        if done.returncode != 0:
            return f"pg_ctl start failed: {done.stderr.strip() or done.stdout.strip()}\n{self.log_text()}"
        return ""

    def stop(self, mode: str = "fast") -> None:
        done = self._pg("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")
        assert done.returncode == 0, f"pg_ctl stop failed: {done.stderr}"

    def kill(self) -> None:
        """Stop it whatever state it is in (teardown)."""
        if not (self.data / "postmaster.pid").exists():
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._pg("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "-t", "30", "stop")
        pidfile = self.data / "postmaster.pid"
        if pidfile.exists():
            with contextlib.suppress(ValueError, ProcessLookupError, OSError):
                os.kill(int(pidfile.read_text().split()[0]), signal.SIGKILL)

    def log_text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def url(self, dbname: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{dbname}"

    def query(self, sql: str, params: tuple = ()) -> list[tuple]:
        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="lab", connect_timeout=10
        ) as conn:
            return conn.execute(sql, params).fetchall()


@pytest.fixture
def postgres() -> Iterator[PrivatePostgres]:
    """A running private PostgreSQL server with an empty database `lab`; skipped, with the reason,
    where this machine cannot run one."""
    bin_dir = _server_bin_dir()
    if bin_dir is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) in /usr/lib/postgresql/*/bin or on PATH")
    as_user: list[str] = []
    owner = None
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no `postgres` OS user to run initdb and postgres as")
        if shutil.which("runuser") is None:
            pytest.skip("running as root and there is no `runuser` to run initdb and postgres as `postgres`")
        as_user = ["runuser", "-u", "postgres", "--"]
    base = Path(tempfile.mkdtemp(prefix="lab-chaos-pg-"))
    if owner is not None:
        os.chown(base, owner.pw_uid, owner.pw_gid)
    server = PrivatePostgres(bin_dir, base, as_user)
    try:
        why_not = server.init() or server.start()
        if why_not:
            pytest.skip(f"cannot run a private PostgreSQL server: {why_not}")
        with psycopg.connect(
            host="127.0.0.1", port=server.port, user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            conn.execute("CREATE DATABASE lab")
        yield server
    finally:
        server.kill()
        shutil.rmtree(base, ignore_errors=True)


def _manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    assert done.returncode == 0, f"manage.py {args[0]} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


# A simulated run (the trainer writes its points, heartbeat and progress) and an async run (its
# trainer also publishes weights and waits for rollout jobs that a rollout worker claims and finishes),
# both in the middle of their training when the database goes down. The simulated run is long
# enough not to be over before the async one, slower to start, has trained 2 steps (a tiny step
# takes a few ms on a fast machine).
CASES = {
    "simulated": {"steps": 1000},
    "async": {"steps": 80, "execution": {"mode": "async", "rollout_workers": 1, "max_staleness": 1}},
}

SUBMIT = """
import json
from django.contrib.auth.models import User
from accounts.models import Membership, Team
from experiments.sweeps import create_experiment, expand
user, _ = User.objects.get_or_create(username="chaos")
team, _ = Team.objects.get_or_create(name="chaos")
Membership.objects.get_or_create(team=team, user=user, is_admin=True)
config = json.loads({config!r})
experiment = create_experiment(team, user, {name!r}, "", expand(config, ["grpo"], [{{}}], [0]))
print(experiment.runs.get().pk)
"""


def logged_steps(postgres, run_id: int) -> list[tuple[str, int, int]]:
    """(name, step, how many points of that step) the run stored, read from its chunks."""
    from collections import Counter

    from experiments import packing

    rows = postgres.query(
        "SELECT name, chunk, packed, step_data, value_data FROM experiments_metricchunk WHERE run_id = %s",
        (run_id,),
    )
    found = Counter(
        (name, step)
        for name, chunk, packed, steps, values in rows
        for step in packing.decode(chunk, packed, bytes(steps), bytes(values))[0].tolist()
    )
    return [(name, step, n) for (name, step), n in found.items()]


def test_runs_survive_a_database_outage_on_their_first_attempt(postgres, tmp_path):
    env = {
        **os.environ,
        "DATABASE_URL": postgres.url("lab"),
        "PYTHONUNBUFFERED": "1",
        "LAB_TORCH_THREADS": WORKER_THREADS,
        "OMP_NUM_THREADS": WORKER_THREADS,
        "MKL_NUM_THREADS": WORKER_THREADS,
        # Longer than the outage; the heartbeat timeout stays the tests' 3 s, far shorter than it,
        # and each worker's own reaper looks for lost runs 5 times a second: the moment the
        # database is back, every heartbeat in it is 20 s old.
        "LAB_DB_OUTAGE_S": str(OUTAGE_S * 4),
        "LAB_REAP_INTERVAL_S": "0.2",
    }
    _manage(env, "migrate", "--noinput")
    for queue in ("cpu", "rollout"):
        purge_queue(queue)
    base = {**TINY_CONFIG, "eval_every": 10, "checkpoint_every": 10}
    configs = {name: {**base, **extra} for name, extra in CASES.items()}

    def state(run_id: int) -> tuple[str, int, int, str]:
        return postgres.query(
            "SELECT status, progress, attempt, error FROM experiments_run WHERE id = %s", (run_id,)
        )[0]

    workers: list[WorkerProcess] = []
    runs, before, after, counts = {}, {}, {}, {}
    web_port = free_port()
    web_url = f"http://127.0.0.1:{web_port}"
    web_log = (tmp_path / "web.log").open("w")
    web = start_web(env, web_port, web_log, limit_s=600)
    try:
        # A training worker per run, so both are mid-run when the one outage starts.
        for n, queue in enumerate(("cpu", "cpu", "rollout")):
            workers.append(WorkerProcess(env, tmp_path / f"worker-{n}.log", f"chaos-db-{n}", queue))
        for name, config in configs.items():
            submitted = _manage(env, "shell", "-c", SUBMIT.format(name=name, config=json.dumps(config)))
            runs[name] = int(submitted.split()[-1])
        token = _manage(env, "create_token", "chaos").strip()
        for name, run_id in runs.items():
            wait_for(lambda run_id=run_id: state(run_id)[1] >= 2, 240, f"2 training steps of the {name} run")
        for name, run_id in runs.items():
            before[name] = state(run_id)
            assert before[name][0] == "running" and before[name][1] < configs[name]["steps"], (
                f"the outage starts mid-run: {name} {before[name]}"
            )

        postgres.stop("fast")
        outage = poll_the_web(web_url, token, runs["async"], OUTAGE_S)
        for w in workers:
            assert w.proc.poll() is None, f"a worker died during the outage:\n{w.log()}"
        why_not = postgres.start()
        assert not why_not, why_not

        for name, run_id in runs.items():
            wait_for(
                lambda run_id=run_id: state(run_id)[0] not in ("queued", "running"),
                300,
                f"the {name} run to end",
            )
            after[name] = state(run_id)
            counts[name] = logged_steps(postgres, run_id)
        jobs = postgres.query(
            "SELECT status, attempt, count(*) FROM experiments_rolloutjob WHERE run_id = %s AND kind = 'batch' "
            "GROUP BY status, attempt",
            (runs["async"],),
        )
        job_errors = postgres.query(
            "SELECT step, part, attempt, error FROM experiments_rolloutjob WHERE run_id = %s AND error <> ''",
            (runs["async"],),
        )
        web_back = [next(iter(seen))[0] for seen in poll_the_web(web_url, token, runs["async"], 0).values()]
    finally:
        stop_workers(workers)
        stop_group(web, signal.SIGKILL, timeout_s=10)
        web_log.close()
        for queue in ("cpu", "rollout"):
            purge_queue(queue)

    expected = {
        case: {(name, step) for name in STEP_METRICS for step in range(1, configs[case]["steps"] + 1)}
        for case in CASES
    }
    lost = {case: len(expected[case] - {(m, t) for m, t, _ in rows}) for case, rows in counts.items()}
    duplicated = {name: sum(n - 1 for _, _, n in rows) for name, rows in counts.items()}
    per_case = [
        f"{case}: down at step {before[case][1]} of {configs[case]['steps']}, {after[case][0]} on attempt "
        f"{after[case][2]}, points {len(expected[case])}, lost {lost[case]}, duplicated {duplicated[case]}"
        for case in CASES
    ]
    print(
        f"chaos database: cases {len(CASES)}, PostgreSQL down {OUTAGE_S} s with both mid-run; {'; '.join(per_case)}; "
        f"async batch jobs (status, attempt, count) {sorted(jobs)}"
    )
    logs = "\n".join(w.log() for w in workers)
    for name in CASES:
        status, _, attempt, error = after[name]
        assert (status, attempt, error) == ("succeeded", 1, ""), f"{name}: {after[name]}\n{logs[-3000:]}"
        assert (lost[name], duplicated[name]) == (0, 0), name
    assert {(status, attempt) for status, attempt, _ in jobs} == {("done", 1)}, (jobs, job_errors)
    assert sum(n for _, _, n in jobs) == configs["async"]["steps"], (
        "one rollout job per step, none made twice"
    )
    assert "database unreachable" in logs and "database reachable again" in logs, "the outage hit the runs"
    print(f"web server during the outage (status, Retry-After: count): {outage}")
    for path, statuses in outage.items():
        assert 500 not in {status for status, _ in statuses}, (path, statuses)
        assert (503, "5") in statuses, f"{path} said it was unavailable: {statuses}"
    assert web_back == [200, 200], "answering again once the database is back"


def poll_the_web(url: str, token: str, run_id: int, seconds: float) -> dict[str, collections.Counter]:
    """(status, Retry-After) of /health and the API, every 0.5 s for `seconds` (at least once)."""
    paths = {"/health": {}, f"/api/runs/{run_id}": {"Authorization": f"Bearer {token}"}}
    seen: dict[str, collections.Counter] = {path: collections.Counter() for path in paths}
    deadline = time.monotonic() + seconds
    while True:
        for path, headers in paths.items():
            request = urllib.request.Request(url + path, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    seen[path][(response.status, response.headers.get("Retry-After"))] += 1
            except urllib.error.HTTPError as exc:
                seen[path][(exc.code, exc.headers.get("Retry-After"))] += 1
            except OSError as exc:
                seen[path][(type(exc).__name__, None)] += 1
        if time.monotonic() >= deadline:
            return seen
        time.sleep(0.5)
