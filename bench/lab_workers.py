"""Real Celery workers for a benchmark: a scratch platform (SQLite and the filesystem broker
under a folder of its own, the shared model cache), workers started on chosen queues the way the
tests start theirs (`WorkerProcess` of tests/platform/support.py), one run submitted and waited
for, and its timing read back from the database; the CPU time each worker process used over a
stretch of wall-clock (`CpuSampler`)."""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "platform"))

from support import WorkerProcess, stop_workers  # noqa: E402

CACHE = REPO / "var" / "cache"
RUN_LIMIT_S = 900
CLK_TCK = os.sysconf("SC_CLK_TCK")


def scratch_env(scratch: Path, threads: int = 1) -> dict[str, str]:
    """The environment of the benchmark's workers; `setup_django` gives this process the same."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(
        LAB_VAR_DIR=str(scratch),
        LAB_CACHE_DIR=str(CACHE),
        LAB_TORCH_THREADS=str(threads),
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        PYTHONUNBUFFERED="1",
    )
    return env


def setup_django(scratch: Path) -> dict[str, str]:
    """A fresh scratch folder, this process pointed at it, the database migrated; the worker env."""
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    return setup_existing(scratch)


def setup_existing(scratch: Path) -> dict[str, str]:
    """This process pointed at a scratch folder as it is (an earlier run's), its database migrated;
    the worker env."""
    env = scratch_env(scratch)
    for key in ("DATABASE_URL", "REDIS_URL"):
        os.environ.pop(key, None)
    os.environ.update({k: env[k] for k in ("LAB_VAR_DIR", "LAB_CACHE_DIR", "LAB_TORCH_THREADS")})
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lab.settings")
    for path in (str(REPO), str(REPO / "platform")):
        if path not in sys.path:
            sys.path.insert(0, path)
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", interactive=False, verbosity=0)
    return env


def start_workers(
    env: dict[str, str], scratch: Path, queues: tuple[str, ...], limit_s: int = 3600
) -> list[WorkerProcess]:
    """One worker per entry of `queues` (a queue named twice gets two), each in its own process
    group, logging to `scratch`/worker-<name>.log and killed after `limit_s`; returns once all say
    they are ready (`stop_workers` stops them)."""
    names = [f"{queue}-{i}" if queues.count(queue) > 1 else queue for i, queue in enumerate(queues)]
    workers: list[WorkerProcess] = []
    try:
        for queue, name in zip(queues, names, strict=True):
            log = scratch / f"worker-{name}.log"
            workers.append(WorkerProcess(env, log, f"bench-{name}", queue, limit_s=limit_s))
    except BaseException:
        stop_workers(workers)
        raise
    return workers


def worker_pids(workers: list[WorkerProcess]) -> list[int]:
    """The Python process of each worker `start_workers` started (its child: `timeout` runs it)."""
    pids = []
    for worker in workers:
        pid = worker.proc.pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        pids.append(int(children[0]))
    return pids


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process `pid` has used, all its threads together."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class CpuSampler:
    """Samples the CPU seconds of processes every `interval` s from a thread while it is entered;
    `between(start, end)` (Unix times) gives what each used in that stretch, to a sample's
    interval: a run's window is known only from its metrics' wall times, after the run. At 20 Hz
    each end of a window is placed to 50 ms (under 1% of a benchmark run's CPU seconds) while the
    sampling takes little of the cores the measured workers share."""

    def __init__(self, pids: list[int], interval: float = 0.05):
        self.pids, self.interval = pids, interval
        self.samples: list[tuple[float, list[float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), [cpu_seconds(pid) for pid in self.pids]))
            self._stop.wait(self.interval)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, start: float, end: float) -> list[float]:
        def at(t: float) -> list[float]:
            return min(self.samples, key=lambda sample: abs(sample[0] - t))[1]

        return [b - a for a, b in zip(at(start), at(end), strict=True)]


def sweep_on_workers(
    config: dict,
    name: str,
    staleness: list[dict],
    seeds: list[int],
    serial: bool = False,
    presets: list[str] | None = None,
):
    """Submit a sweep of `presets` (default: `config`'s preset) × `staleness` cells × `seeds` as the
    form and the API do, wait for every run to succeed, return the experiment."""
    from django.contrib.auth import get_user_model

    from accounts.models import Membership, Team
    from experiments.models import Run
    from experiments.sweeps import create_experiment, expand

    team, _ = Team.objects.get_or_create(name="bench")
    owner, _ = get_user_model().objects.get_or_create(username="bench")
    Membership.objects.get_or_create(team=team, user=owner, defaults={"is_admin": True})
    presets = presets or [config.get("algorithm", {}).get("preset", "rec-oneside-nois")]
    experiment = create_experiment(team, owner, name, "", expand(config, presets, staleness, seeds, serial))
    deadline = time.monotonic() + RUN_LIMIT_S * len(presets) * len(staleness) * len(seeds)
    while experiment.runs.filter(status__in=Run.ACTIVE).exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"experiment {experiment.pk} did not finish in time")
        time.sleep(0.5)
    for run in experiment.runs.all():
        if run.status != Run.SUCCEEDED:
            raise RuntimeError(f"run {run.pk} ended {run.status}: {run.error}")
    return experiment


def run_on_workers(config: dict, name: str):
    """Submit `config` as a one-run experiment, wait for it to succeed, return the run."""
    config = dict(config)
    staleness = config.pop("staleness", {})
    return sweep_on_workers(config, name, [staleness], [0]).runs.get()


def series(run, name: str) -> dict[int, float]:
    from experiments import series as metric_series

    steps, values, _ = metric_series.series(run.pk, name)
    return dict(zip(steps.tolist(), map(metric_series.shown, values.tolist()), strict=True))


def window(run, first: int) -> tuple[float, float]:
    """Unix times of step `first`'s metrics and of the run's last point (the final evaluation,
    which rollout workers may finish after the last step)."""
    from experiments import series as metric_series

    steps, _, times = metric_series.series(run.pk, "loss")
    start = times[steps.tolist().index(first)] / 1e6
    return start, max(times.max() for _, (_, _, times) in metric_series.points_of(run.pk)) / 1e6
