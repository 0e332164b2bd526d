"""What a worker measures of each run: wall-clock per phase adding up to the attempt, steady
steps, tokens and CPU, and the cores other processes used meanwhile. A run with a CPU-burning
process beside it (started and stopped here) counts at least the burner's CPU time as others', so
it is flagged contended and left out of the default throughput comparison. Its twin, run without
the burner, is flagged by the same rule on whatever else the machine ran: on an otherwise idle
machine it is not contended and counts; on a busy one it is left out too (a test may not rely on
the machine being idle)."""

from __future__ import annotations

import resource
import subprocess
import sys
import time

import pytest
from django.conf import settings
from django.urls import reverse
from support import TINY_CONFIG, queue_sweep, wait_for

from experiments.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

# Steps enough for an attempt beside the burner to last well over the /proc/stat ticks it is
# measured in (the tiny model trains tens of steps a second once warm).
CONFIG = {**TINY_CONFIG, "steps": 40, "eval_every": 20, "checkpoint_every": 0}
SLACK_S = 0.2  # CPU seconds /proc/stat may count wrong over an attempt: 20 ticks of 10 ms
PARTS = ("startup", "warm_start", "first_step", "steady", "eval", "checkpoint")
BURN = "import time\nend = time.monotonic() + 300\nwhile time.monotonic() < end: pass\n"


def run_to_end(team, alice, name: str) -> Run:
    run = queue_sweep(team, alice, name, config=CONFIG).runs.get()
    wait_for(lambda: Run.objects.get(pk=run.pk).status not in Run.ACTIVE, 300, f"run {name} to end", 0.5)
    run.refresh_from_db()
    assert run.status == Run.SUCCEEDED, run.error
    return run


def burned_s(before: resource.struct_rusage) -> float:
    """CPU seconds of the children reaped since `before`."""
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def test_a_run_beside_a_cpu_burner_is_flagged_contended_and_left_out(start_worker, team, alice, alice_client):
    start_worker()
    threshold = settings.LAB_CONTENDED_CORES
    twin = run_to_end(team, alice, "quiet")
    s = twin.summary
    assert sum(s[f"time/{part}_s"] for part in PARTS) == pytest.approx(s["time/attempt_s"], rel=1e-9)
    assert s["steps/steady"] == CONFIG["steps"] - 1
    assert s["time/steady_s"] > 0 and s["time/first_step_s"] > 0 and s["time/eval_s"] > 0
    assert s["tokens/total"] > s["tokens/steady"] > 0
    assert s["cpu/trainer_s"] >= s["cpu/trainer_steady_s"] > 0 and s["cpu/rollout_s"] == 0
    assert s["threads/trainer"] >= 1 and s["machine/others_cores"] >= 0
    # Whatever else runs here counts as others' (this test's process and services too): the rule,
    # not an idle machine, decides the twin's flag.
    quiet_contended = s["machine/others_cores"] > threshold
    assert s["machine/contended"] == float(quiet_contended), s["machine/others_cores"]

    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    burner = subprocess.Popen([sys.executable, "-c", BURN])
    try:
        contended = run_to_end(team, alice, "beside a burner")
    finally:
        burner.kill()
        lived = time.monotonic() - started
        burner.wait(timeout=10)
    c = contended.summary
    # What the burner burned during the attempt: all it burned, less at most one core for as long
    # as it lived outside the attempt's wall-clock; the others' cores measured include at least
    # that, however busy the machine was otherwise.
    burned, wall = burned_s(reaped), c["time/attempt_s"]
    at_least = (burned - (lived - wall) - SLACK_S) / wall
    measured = (
        c["machine/others_cores"],
        f"burner: {burned:.2f} CPU s in {lived:.2f} s, attempt {wall:.2f} s",
    )
    assert c["machine/others_cores"] >= at_least, measured
    assert c["machine/others_cores"] > threshold and c["machine/contended"] == 1, measured

    ids = f"{twin.pk},{contended.pk}"
    data = alice_client.get(reverse("runs-compare-data"), {"runs": ids}).json()
    rows = {r["experiment"]: r for r in data["throughput"]}
    quiet, busy = rows[twin.experiment_id], rows[contended.experiment_id]
    assert (busy["n_seeds"], busy["n_contended"], busy["steps_per_hour"]) == (0, 1, None)
    if quiet_contended:  # a busy machine: the twin is left out alike
        assert (quiet["n_seeds"], quiet["n_contended"], quiet["steps_per_hour"]) == (0, 1, None)
    else:
        assert (quiet["n_seeds"], quiet["n_contended"]) == (1, 0) and quiet["steps_per_hour"] > 0
    flags = {r["id"]: r["contended"] for r in data["runs"]}
    assert flags == {twin.pk: quiet_contended, contended.pk: True}
    shown = alice_client.get(reverse("runs-compare-data"), {"runs": ids, "contended": "1"}).json()
    assert {r["experiment"]: (r["n_seeds"], r["steps_per_hour"] > 0) for r in shown["throughput"]} == {
        twin.experiment_id: (1, True),
        contended.experiment_id: (1, True),
    }


def test_a_trainer_s_other_processes_count_as_its_cpu_not_as_others():
    """Rank 0 of a run in several ranks counts its fellow ranks' CPU as the trainer's (they are
    the run's own work, not the machine's load): here a burner stands for the other rank, and
    two measurements of the same interval, one told of it and one not, differ by its CPU: in
    `cpu/trainer_s`, and the other way in what is left to other processes (counted as theirs,
    every run in two ranks would read contended). Its thread counts beside this process's."""
    import torch

    from rlcore.sinks import PREPARING, TRAINING
    from workers.measure import Measurement, process_cpu_s

    burner = subprocess.Popen([sys.executable, "-c", BURN])
    try:
        told, untold = Measurement(others=lambda: [burner.pid]), Measurement()
        for measurement in (told, untold):
            measurement.phase(PREPARING)
        first = process_cpu_s(burner.pid)
        wait_for(lambda: process_cpu_s(burner.pid) - first >= 0.5, 60, "the burner to use 0.5 CPU s")
        for measurement in (told, untold):
            measurement.phase(TRAINING, step=1)
            measurement.stop()
        burned = process_cpu_s(burner.pid) - first
        told_report, untold_report = told.report([]), untold.report([])
    finally:
        burner.kill()
        burner.wait()
    assert burned >= 0.5
    assert abs(told_report["cpu/trainer_s"] - untold_report["cpu/trainer_s"] - burned) <= SLACK_S

    def others_s(report: dict[str, float]) -> float:
        return report["machine/others_cores"] * report["time/attempt_s"]

    assert others_s(untold_report) - others_s(told_report) >= burned - 2 * SLACK_S
    assert (
        told_report["threads/trainer"] == 2 * untold_report["threads/trainer"] == 2 * torch.get_num_threads()
    )
