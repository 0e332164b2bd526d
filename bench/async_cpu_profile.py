"""Where an async run's extra CPU goes: py-spy on both workers of one run, against a simulated run.

`bench/async_speedup.py` measures that async (`max_staleness: 1`, a training worker and a rollout
worker, 1 torch thread each) uses more CPU than the simulated run with 1 thread; this script says
on what. It trains `examples/arithmetic.yaml` (`--steps`, default 100) once simulated with 1
thread under `py-spy record` (the whole process) and once async on two real Celery workers with
py-spy attached to each from step 2 to the run's end, sampling at 200 Hz (`--nonblocking`: the
workers are not paused). Each sample is put in the first part whose function is on its stack
(`PARTS`, in order); a thread sleeping in a wait (py-spy counts some as active) is left out.
Prints seconds of CPU per part and worker, for the two runs side by side; the simulated run's
also holds its start-up (imports, θ0) and the evaluation of step 0, which the async window
leaves out.

Needs py-spy (`pip install py-spy`, not a dependency of the lab): `--py-spy PATH`, default the
one on PATH.

    .venv/bin/python bench/async_cpu_profile.py --steps 100
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "platform"), str(REPO / "bench")]

from bench.async_speedup import ASYNC, SIMULATED, base_config, quiet  # noqa: E402
from bench.lab_workers import (  # noqa: E402
    CACHE,
    CpuSampler,
    run_on_workers,
    setup_django,
    start_workers,
    stop_workers,
    window,
    worker_pids,
)

SCRATCH = REPO / "var" / "bench-async-profile"
RATE = 200
# (part, functions any of which on a sample's stack puts it there): the first that matches.
PARTS = [
    ("evaluation (greedy, sampled, θ0 scoring)", ["evaluate_part (rlcore/evaluate.py"]),
    ("update (train_step)", ["train_step (rlcore/trainer.py"]),
    ("θ0 log-probs with a batch", ["Producer.init_logp"]),
    ("generation (Producer.batch)", ["Producer.batch (rlcore/produce.py", "LocalSource.take"]),
    ("weights: publish (write + sha256)", ["Publisher.publish"]),
    ("weights: load (read + sha256 + copy in)", ["load_into (workers/rollout.py", "load_evaluator"]),
    ("batch files (write, read + sha256)", ["Batch.save", "Batch.load", "Batch.concat"]),
    ("database: trainer (publish, take, evaluations)", ["DatabaseSource."]),
    ("database: metrics flush thread", ["_flush_loop"]),
    (
        "database + lease: rollout jobs",
        ["workers/jobs.py", "execute (workers/rollout.py", "generate (workers/rollout.py"],
    ),
    ("the trainer's loop, other", ["steps (rlcore/trainer.py"]),
    ("Celery and kombu (messages)", ["celery/", "kombu/"]),
]
WAITING = ("Condition.wait (threading.py", "Event.wait (threading.py", "sleep")


def parts_of(path: Path) -> collections.Counter:
    """CPU seconds per part of a `py-spy record -f raw` file."""
    seconds: collections.Counter = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if any(frames[-1].startswith(w) for w in WAITING):
            continue
        part = next((name for name, keys in PARTS if any(k in stack for k in keys)), "other")
        seconds[part] += int(count) / RATE
    return seconds


def record(py_spy: str, out: Path, pid: int) -> subprocess.Popen:
    return subprocess.Popen(
        [py_spy, "record", "--nonblocking", "-r", str(RATE), "-f", "raw", "-o", str(out), "-p", str(pid)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--py-spy", default=shutil.which("py-spy"))
    args = parser.parse_args()
    if not args.py_spy:
        parser.error("--py-spy: py-spy is not on PATH (pip install py-spy)")
    env = setup_django(SCRATCH)
    out = SCRATCH / "profiles"
    out.mkdir()

    print("simulated, 1 thread ...", flush=True)
    others = [quiet()]
    reference = {**base_config(args.steps), "staleness": {"sync_offset": 1}}
    threads = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    simulated = subprocess.run(
        [
            args.py_spy,
            "record",
            "--nonblocking",
            "-r",
            str(RATE),
            "-f",
            "raw",
            "-o",
            str(out / "simulated.txt"),
        ]
        + ["--", sys.executable, "-c", SIMULATED, json.dumps(reference), str(CACHE), "1"],
        cwd=REPO,
        env=threads,
        capture_output=True,
        text=True,
        check=True,
    )
    # The run's own line (py-spy adds lines of its own).
    line = next(x for x in reversed(simulated.stdout.splitlines()) if x.startswith('{"seconds"'))
    simulated_cpu = json.loads(line)["cpu"][0]

    print("async (training worker + rollout worker, 1 thread each) ...", flush=True)
    from experiments.models import Run

    workers = start_workers(env, SCRATCH, ("cpu", "rollout"))
    try:
        pids = worker_pids(workers)
        others.append(quiet())
        done: dict = {}
        config = {**base_config(args.steps), "execution": ASYNC}
        submit = threading.Thread(target=lambda: done.update(run=run_on_workers(config, "async cpu profile")))
        with CpuSampler(pids) as sampler:
            submit.start()
            while not Run.objects.filter(status=Run.RUNNING, progress__gte=2).exists():
                time.sleep(0.05)
            spies = [
                record(args.py_spy, out / f"{name}.txt", pid)
                for name, pid in zip(("trainer", "rollout"), pids, strict=True)
            ]
            submit.join()
            for spy in spies:
                spy.send_signal(signal.SIGINT)
            for spy in spies:
                spy.wait(60)
        start, end = window(done["run"], 1)
        async_cpu = sampler.between(start, end)
    finally:
        stop_workers(workers)

    columns = {name: parts_of(out / f"{name}.txt") for name in ("simulated", "trainer", "rollout")}
    names = [name for name, _ in PARTS] + ["other"]
    print(
        f"\nCPU s from step 1 to the end (/proc): simulated {simulated_cpu:.1f}, async "
        f"{async_cpu[0]:.1f} + {async_cpu[1]:.1f} = {sum(async_cpu):.1f} ({sum(async_cpu) / simulated_cpu:.2f}×); "
        f"cores other processes used before each: {others[0]:.2f}, {others[1]:.2f}"
    )
    print("\n| part | simulated | async: trainer | async: rollout | async − simulated |")
    print("|---|---|---|---|---|")
    for name in names:
        sim, trainer, rollout = (columns[c].get(name, 0.0) for c in ("simulated", "trainer", "rollout"))
        print(f"| {name} | {sim:.2f} | {trainer:.2f} | {rollout:.2f} | {trainer + rollout - sim:+.2f} |")


if __name__ == "__main__":
    main()
