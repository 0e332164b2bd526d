"""Workers on a Slurm cluster: `deploy/slurm/training-worker.sbatch` submitted with `sbatch` to a
real one-node Slurm (Debian's slurm-wlm and munge, which `make test` installs) that this module
starts on 127.0.0.1 (munged with a generated key, then slurmctld and slurmd with a generated
slurm.conf: their own ports and folders, no cgroups). A run submitted through the API trains on the
worker the job started (its identity is the job's host and batch PID), and `scancel` of that job
while a run trains makes the run re-queue like any lost worker's, then resume from its checkpoint
on a worker another job started. Without Slurm's binaries those two tests are skipped, saying so;
the scripts' refusals of bad settings are tested either way."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from support import (
    REPO,
    TEST_VAR,
    TINY_CONFIG,
    RedisServer,
    free_port,
    last_step,
    purge_queue,
    stop_group,
    use_broker,
    wait_for,
    wait_for_log,
)
from worker_helpers import assert_resumed_once, reap_lost

from accounts.models import ApiToken
from experiments.models import Run

SBATCH_SCRIPT = REPO / "deploy" / "slurm" / "training-worker.sbatch"
ROLLOUT_SCRIPT = REPO / "deploy" / "slurm" / "rollout-worker.sbatch"
SLURM_BINARIES = (
    "mungekey",
    "munged",
    "munge",
    "slurmctld",
    "slurmd",
    "sbatch",
    "squeue",
    "scancel",
    "sinfo",
)
# The daemons are Debian's /usr/sbin, which a user's PATH may leave out.
SEARCH_PATH = f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"
MISSING = [name for name in SLURM_BINARIES if shutil.which(name, path=SEARCH_PATH) is None]

# Everything this module starts is killed after this long, whatever happens to the test.
LIMIT_S = 900
# Kills every process of the cluster (each has its SLURM_CONF; a job's too, which Slurm's slurmstepd
# runs outside any process group of ours) once pytest is gone or `LIMIT_S` is over, whichever is
# first: nothing is left even when pytest itself is killed. (`--foreground` keeps `timeout` in the
# watchdog's process group, which teardown kills.)
WATCHDOG = """
timeout --foreground {limit} tail --pid={pid} -f /dev/null
for environ in /proc/[0-9]*/environ; do
    if grep -qzx "SLURM_CONF={conf}" "$environ" 2>/dev/null; then
        pid="${{environ#/proc/}}"
        kill -KILL "${{pid%/environ}}" 2>/dev/null
    fi
done
"""
READY_TIMEOUT_S = 120
END_TIMEOUT_S = 240
# Long enough to be training when the job is cancelled after a checkpoint, and short enough to
# finish on the worker of the next job.
STEPS = 300

needs_slurm = pytest.mark.skipif(
    bool(MISSING),
    reason=f"Slurm is not installed (no {', '.join(MISSING)}): `make test` installs Debian's slurm-wlm and munge",
)


def binary(name: str) -> str:
    return shutil.which(name, path=SEARCH_PATH)


class SlurmCluster:
    """munged, slurmctld and slurmd of this test's own on 127.0.0.1: free ports, every file under
        a temporary folder (short, for munge's socket path), one node of 2 CPUs named after this host
    (its short name, as Slurm's daemons name their host);
        each daemon in its own process group, killed after `LIMIT_S`. `stop` cancels every job and
        ends every process of the cluster, jobs included."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="lab-slurm-"))
        self.conf = self.dir / "slurm.conf"
        self.host = socket.gethostname()
        self.node = self.host.split(".")[0]
        self.env = {**os.environ, "SLURM_CONF": str(self.conf), "PATH": SEARCH_PATH}
        self.daemons: list[tuple[str, subprocess.Popen]] = []
        self.watchdog: subprocess.Popen | None = None
        self._logs: list = []

    def start(self) -> None:
        self.watchdog = subprocess.Popen(
            ["bash", "-c", WATCHDOG.format(limit=LIMIT_S, pid=os.getpid(), conf=self.conf)],
            env={k: v for k, v in os.environ.items() if k != "SLURM_CONF"},
            start_new_session=True,
        )
        munge = self.dir / "munge"
        for folder in (munge, self.dir / "state", self.dir / "spool"):
            folder.mkdir(mode=0o700)
        # munged wants its socket's folders searchable by everyone (the socket is how every user's
        # processes reach it), and nothing of it writable by others.
        for folder in (self.dir, munge):
            folder.chmod(0o711)
        key, self.socket = munge / "munge.key", munge / "munge.socket"
        subprocess.run([binary("mungekey"), "--create", f"--keyfile={key}"], check=True, capture_output=True)
        self._daemon(
            "munged",
            "--foreground",
            f"--key-file={key}",
            f"--socket={self.socket}",
            f"--pid-file={munge / 'munged.pid'}",
            f"--log-file={munge / 'munged.log'}",
            f"--seed-file={munge / 'munged.seed'}",
        )
        wait_for(self._munge_answers, 30, "munged to answer on its socket")
        self.conf.write_text(self._slurm_conf())
        self._daemon("slurmctld", "-D", "-i", "-f", str(self.conf))
        self._daemon("slurmd", "-D", "-N", self.node, "-f", str(self.conf))
        wait_for(self._node_idle, 60, f"node {self.node} to be idle (logs under {self.dir})", interval_s=0.5)

    def _daemon(self, name: str, *args: str) -> None:
        log = (self.dir / f"{name}.out").open("w")
        self._logs.append(log)
        proc = subprocess.Popen(
            ["timeout", "-s", "KILL", str(LIMIT_S), binary(name), *args],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.daemons.append((name, proc))

    def _check_daemons(self) -> None:
        for name, proc in self.daemons:
            if proc.poll() is not None:
                pytest.fail(
                    f"{name} exited with {proc.returncode}:\n{(self.dir / f'{name}.out').read_text()}"
                )

    def _munge_answers(self) -> bool:
        self._check_daemons()
        return (
            self.socket.exists()
            and subprocess.run(
                [binary("munge"), "-n", "-S", str(self.socket)], capture_output=True
            ).returncode
            == 0
        )

    def _slurm_conf(self) -> str:
        with open("/proc/meminfo") as meminfo:
            total_mb = int(next(line for line in meminfo if line.startswith("MemTotal:")).split()[1]) // 1024
        d = self.dir
        return f"""\
ClusterName=labtest
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.socket}
StateSaveLocation={d / "state"}
SlurmdSpoolDir={d / "spool"}
SlurmctldPidFile={d / "slurmctld.pid"}
SlurmdPidFile={d / "slurmd.pid"}
SlurmctldLogFile={d / "slurmctld.log"}
SlurmdLogFile={d / "slurmd.log"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
KillWait=1
NodeName={self.node} NodeAddr=127.0.0.1 NodeHostname={self.host} CPUs=2 RealMemory={total_mb // 2} State=UNKNOWN
PartitionName=lab Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
"""

    def command(self, *args: str, check: bool = True) -> str:
        """A Slurm client command against this cluster; its standard output."""
        done = subprocess.run(
            [binary(args[0]), *args[1:]], env=self.env, capture_output=True, text=True, timeout=60
        )
        if check and done.returncode != 0:
            pytest.fail(f"{' '.join(args)} exited with {done.returncode}: {done.stderr}")
        return done.stdout

    def _node_idle(self) -> bool:
        self._check_daemons()
        return self.command("sinfo", "-h", "-n", self.node, "-o", "%T", check=False).strip() == "idle"

    def sbatch(self, script: Path, env: dict[str, str], *options: str) -> int:
        """Submit `script` from the repository root with `env` (sbatch passes it on); the job id."""
        done = subprocess.run(
            [binary("sbatch"), "--parsable", *options, str(script)],
            cwd=REPO,
            env={**env, "SLURM_CONF": str(self.conf), "PATH": SEARCH_PATH},
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            pytest.fail(f"sbatch exited with {done.returncode}: {done.stderr}")
        return int(done.stdout.strip().split(";")[0])

    def state(self, job: int) -> str:
        """The job's state as squeue says it (RUNNING, CANCELLED, …); "" once Slurm forgot it."""
        return self.command("squeue", "-h", "-t", "all", "-j", str(job), "-o", "%T", check=False).strip()

    def processes(self) -> list[int]:
        """The PIDs of every process of this cluster, its jobs' too: each has its SLURM_CONF."""
        mark = f"SLURM_CONF={self.conf}".encode()
        found = []
        for environ in Path("/proc").glob("[0-9]*/environ"):
            with contextlib.suppress(OSError):
                if mark in environ.read_bytes().split(b"\0") and int(environ.parent.name) != os.getpid():
                    found.append(int(environ.parent.name))
        return found

    def stop(self) -> str:
        """Cancel every job, stop the daemons, then SIGKILL whatever of the cluster is left; the
        leftovers' PIDs ("" when none: every job ended when cancelled)."""
        leftover = ""
        if self.conf.exists() and all(proc.poll() is None for _, proc in self.daemons):
            self.command("scancel", "--partition", "lab", check=False)
            with contextlib.suppress(pytest.fail.Exception):
                wait_for(lambda: not self.command("squeue", "-h", check=False).strip(), 30, "jobs to end")
        for _, proc in reversed(self.daemons):
            stop_group(proc, signal.SIGTERM, timeout_s=10)
        deadline = time.monotonic() + 10  # a job step's slurmstepd ends on its own after its job
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in self.processes():
            leftover += f" {pid}"
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.watchdog is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.watchdog.pid, signal.SIGKILL)
            self.watchdog.wait()
        for log in self._logs:
            log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return leftover.strip()


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    cluster = SlurmCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        assert cluster.stop() == "", "every process of the cluster ended with it"


@pytest.fixture(scope="module")
def broker_url() -> Iterator[str]:
    """The suite's Redis, or (when it runs with the filesystem broker) a redis-server of this
    module's own that this process sends with: a worker on a cluster node needs Redis."""
    if os.environ.get("REDIS_URL"):
        yield os.environ["REDIS_URL"]
        return
    if shutil.which("redis-server") is None:
        pytest.skip("the suite runs without REDIS_URL and there is no redis-server to start for the workers")
    folder = Path(tempfile.mkdtemp(prefix="lab-slurm-redis-"))
    server = RedisServer(folder / "redis.log")
    try:
        server.start()
        with use_broker(server.url):
            yield server.url
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


class SlurmWorker:
    """A training worker that `sbatch deploy/slurm/training-worker.sbatch` started on `slurm`,
    taking the cpu queue; returns once the worker says it is ready in the job's log."""

    def __init__(self, slurm: SlurmCluster, env: dict[str, str], log_dir: Path):
        self.slurm = slurm
        self.job = slurm.sbatch(
            SBATCH_SCRIPT,
            env,
            "--gres=none",
            "--cpus-per-task=1",
            "--mem=1G",
            "--time=10",
            f"--output={log_dir}/worker-%j.log",
        )
        self.log_path = log_dir / f"worker-{self.job}.log"
        match = wait_for(
            self._ready, READY_TIMEOUT_S, f"the worker of job {self.job} to start ({self.log_path})"
        )
        self.identity = match.group(1)
        self.host, pid, _ = self.identity.split(":")
        self.pid = int(pid)

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def _ready(self):
        state = self.slurm.state(self.job)
        if state not in ("PENDING", "CONFIGURING", "RUNNING"):
            pytest.fail(f"job {self.job} is {state or 'gone'} before its worker was ready:\n{self.log()}")
        return re.search(r"worker (\S+) ready on", self.log())

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True


@pytest.fixture
def sbatch_worker(slurm, broker_url, worker_env, tmp_path) -> Iterator:
    """`sbatch_worker()`: a `SlurmWorker` against the test database and `broker_url`, with the
    test's LAB_VAR_DIR and settings; every job is cancelled at teardown."""
    env = {
        **worker_env,
        "REDIS_URL": broker_url,
        "LAB_QUEUE": "cpu",
        "LAB_PYTHON": sys.executable,
        "LAB_VAR_DIR": str(TEST_VAR),
    }
    started: list[SlurmWorker] = []

    def start() -> SlurmWorker:
        started.append(SlurmWorker(slurm, env, tmp_path))
        return started[-1]

    purge_queue("cpu")
    yield start
    for worker in started:
        slurm.command("scancel", str(worker.job), check=False)
    for worker in started:
        wait_for(lambda w=worker: not w.alive(), 30, f"job {worker.job}'s worker to end")


def submit(client, alice, name: str, config: dict) -> Run:
    """One grpo run of `config` submitted through the API (`POST /api/sweeps`), as alice."""
    response = client.post(
        "/api/sweeps",
        {"name": name, "team": "team-a", "config": config, "presets": ["grpo"], "seeds": [0]},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {ApiToken.issue(alice)}",
    )
    assert response.status_code == 201, response.content
    (run_id,) = response.json()["runs"]
    return Run.objects.get(pk=run_id)


def job_of(pid: int) -> str | None:
    """The Slurm job id in process `pid`'s environment."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return next((v.split(b"=", 1)[1].decode() for v in environ if v.startswith(b"SLURM_JOB_ID=")), None)


@needs_slurm
@pytest.mark.django_db(transaction=True)
def test_a_run_submitted_through_the_api_trains_on_a_worker_that_sbatch_started(
    slurm, sbatch_worker, client, alice
):
    worker = sbatch_worker()
    log = worker.log()
    assert f"Slurm job {worker.job} on {slurm.host}, pid {worker.pid}," in log, log
    assert f"LAB_VAR_DIR={TEST_VAR}, torch threads 1, run memory ceiling 768 MiB" in log, log
    # The worker is the job's batch process itself (the script and `manage.py worker` exec it).
    assert job_of(worker.pid) == str(worker.job)
    assert (worker.host, slurm.state(worker.job)) == (slurm.host, "RUNNING")
    assert slurm.command("squeue", "-h", "-j", str(worker.job), "-o", "%N").strip() == slurm.node

    run = submit(client, alice, "on slurm", TINY_CONFIG)
    wait_for(lambda: Run.objects.get(pk=run.pk).status not in Run.ACTIVE, END_TIMEOUT_S, "the run to end")
    run.refresh_from_db()
    assert (run.status, run.attempt, run.worker) == (Run.SUCCEEDED, 1, worker.identity), run.error
    wait_for_log(worker, f"run {run.pk} attempt 1: succeeded")
    assert last_step(run, "loss") == TINY_CONFIG["steps"]


@needs_slurm
@pytest.mark.django_db(transaction=True)
def test_scancel_of_the_job_requeues_its_run_like_any_lost_worker(
    slurm, sbatch_worker, client, alice, capsys
):
    config = {**TINY_CONFIG, "steps": STEPS, "eval_every": 100, "checkpoint_every": 10}
    first = sbatch_worker()
    run = submit(client, alice, "cancelled job", config)
    wait_for(
        lambda: (last_step(run, "loss") or -1) >= 12, END_TIMEOUT_S, "12 steps on the first job's worker"
    )
    run.refresh_from_db()
    assert (run.status, run.worker) == (Run.RUNNING, first.identity)

    slurm.command("scancel", str(first.job))
    # Slurm sends SIGCONT and SIGTERM now, SIGKILL a few seconds later (KillWait; slurmd waits 5 s
    # at least). Celery's warm shutdown trains on meanwhile: a run on a cluster is far longer than
    # that, but this tiny one could end in it on a fast machine. Frozen once the SIGTERM is in, the
    # worker dies by Slurm's SIGKILL in the middle of its run, as a real one does.
    wait_for_log(first, "worker: Warm shutdown", 30)
    os.kill(first.pid, signal.SIGSTOP)
    wait_for(lambda: not first.alive(), 60, f"Slurm to kill job {first.job}'s worker")
    wait_for(lambda: slurm.state(first.job) in ("CANCELLED", ""), 60, f"job {first.job} to end")
    run.refresh_from_db()
    assert (run.status, run.attempt, run.worker) == (Run.RUNNING, 1, first.identity)

    reap_lost(run, capsys, first.identity)

    second = sbatch_worker()
    assert second.job != first.job
    wait_for(lambda: Run.objects.get(pk=run.pk).status not in Run.ACTIVE, END_TIMEOUT_S, "attempt 2 to end")
    run.refresh_from_db()
    assert (run.status, run.attempt, run.worker) == (Run.SUCCEEDED, 2, second.identity), run.error
    assert_resumed_once(run, STEPS)


HAS_GPU = shutil.which("nvidia-smi") is not None and (
    subprocess.run(["nvidia-smi", "-L"], capture_output=True).stdout.startswith(b"GPU")
)


def _script_env(**changes: str) -> dict[str, str]:
    env = {
        "PATH": os.environ["PATH"],
        "DATABASE_URL": "postgres://lab@db.example:5432/lab",
        "REDIS_URL": "redis://redis.example:6379/0",
        "LAB_VAR_DIR": str(TEST_VAR),
        "LAB_REPO": str(REPO),
        "LAB_PYTHON": "/bin/false",  # never reached: every case below is refused before
        **changes,
    }
    return {k: v for k, v in env.items() if v}


@pytest.mark.parametrize(
    ("script", "changes", "message"),
    [
        (
            SBATCH_SCRIPT,
            {"LAB_QUEUE": "rollout"},
            "LAB_QUEUE=rollout: a training worker's queue is gpu or cpu",
        ),
        (
            ROLLOUT_SCRIPT,
            {"LAB_QUEUE": "cpu"},
            "LAB_QUEUE=cpu: a rollout worker's queue is rollout-gpu or rollout",
        ),
        (SBATCH_SCRIPT, {"LAB_QUEUE": "cpu", "DATABASE_URL": ""}, "DATABASE_URL is not set"),
        (ROLLOUT_SCRIPT, {"LAB_QUEUE": "rollout", "REDIS_URL": ""}, "REDIS_URL is not set"),
        (SBATCH_SCRIPT, {"LAB_QUEUE": "cpu", "LAB_VAR_DIR": ""}, "LAB_VAR_DIR is not set"),
        (
            SBATCH_SCRIPT,
            {"LAB_QUEUE": "cpu", "LAB_VAR_DIR": "/nonexistent/lab-var"},
            "LAB_VAR_DIR=/nonexistent/lab-var is no folder on",
        ),
        (
            SBATCH_SCRIPT,
            {"LAB_QUEUE": "cpu", "LAB_PYTHON": "/nonexistent/python"},
            "LAB_PYTHON=/nonexistent/python",
        ),
        (
            SBATCH_SCRIPT,
            {"LAB_QUEUE": "cpu", "LAB_REPO": "/nonexistent"},
            "LAB_REPO=/nonexistent is no checkout",
        ),
        (REPO / "deploy" / "slurm" / "worker.sh", {"LAB_QUEUE": "cpu"}, "submit training-worker.sbatch or"),
        pytest.param(
            ROLLOUT_SCRIPT,
            {},
            "LAB_QUEUE=rollout-gpu needs a GPU and this job sees none",
            marks=pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU"),
        ),
    ],
)
def test_the_scripts_refuse_bad_settings_naming_them(script, changes, message, tmp_path):
    """Run as the batch script of a job would be (without Slurm): exit 2 before any worker starts."""
    done = subprocess.run(
        ["bash", str(script)],
        env=_script_env(**changes),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.startswith("error: ") and message in done.stderr, done.stderr


def test_the_worker_command_refuses_an_unknown_queue_or_name():
    with pytest.raises(CommandError, match="invalid choice: 'gpus'"):
        call_command("worker", "gpus")
    with pytest.raises(CommandError, match="--name: letters, digits"):
        call_command("worker", "cpu", "--name", "a@b")
