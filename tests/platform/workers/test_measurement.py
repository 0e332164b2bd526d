"""What a worker measures of each run: wall-clock per phase adding up to the attempt, steady
steps, tokens and CPU; and a run with a CPU-burning process beside it (started and stopped here)
is flagged contended and left out of the default throughput comparison, its twin is not."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.urls import reverse
from support import TINY_CONFIG, queue_sweep, wait_for

from experiments.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

CONFIG = {**TINY_CONFIG, "steps": 14, "eval_every": 7, "checkpoint_every": 0}
PARTS = ("startup", "warm_start", "first_step", "steady", "eval", "checkpoint")
BURN = "import time\nend = time.monotonic() + 300\nwhile time.monotonic() < end: pass\n"


def run_to_end(team, alice, name: str) -> Run:
    run = queue_sweep(team, alice, name, config=CONFIG).runs.get()
    wait_for(lambda: Run.objects.get(pk=run.pk).status not in Run.ACTIVE, 300, f"run {name} to end", 0.5)
    run.refresh_from_db()
    assert run.status == Run.SUCCEEDED, run.error
    return run


def test_a_run_beside_a_cpu_burner_is_flagged_contended_and_left_out(start_worker, team, alice, alice_client):
    start_worker()
    twin = run_to_end(team, alice, "quiet")
    s = twin.summary
    assert sum(s[f"time/{part}_s"] for part in PARTS) == pytest.approx(s["time/attempt_s"], rel=1e-9)
    assert s["steps/steady"] == CONFIG["steps"] - 1
    assert s["time/steady_s"] > 0 and s["time/first_step_s"] > 0 and s["time/eval_s"] > 0
    assert s["tokens/total"] > s["tokens/steady"] > 0
    assert s["cpu/trainer_s"] >= s["cpu/trainer_steady_s"] > 0 and s["cpu/rollout_s"] == 0
    assert s["threads/trainer"] >= 1 and s["machine/contended"] == 0, s["machine/others_cores"]

    burner = subprocess.Popen([sys.executable, "-c", BURN])
    try:
        contended = run_to_end(team, alice, "beside a burner")
    finally:
        burner.kill()
        burner.wait(timeout=10)
    assert contended.summary["machine/contended"] == 1
    assert contended.summary["machine/others_cores"] > 0.5

    ids = f"{twin.pk},{contended.pk}"
    data = alice_client.get(reverse("runs-compare-data"), {"runs": ids}).json()
    rows = {r["experiment"]: r for r in data["throughput"]}
    quiet, busy = rows[twin.experiment_id], rows[contended.experiment_id]
    assert (quiet["n_seeds"], quiet["n_contended"], busy["n_seeds"], busy["n_contended"]) == (1, 0, 0, 1)
    assert quiet["steps_per_hour"] > 0 and busy["steps_per_hour"] is None
    flags = {r["id"]: r["contended"] for r in data["runs"]}
    assert flags == {twin.pk: False, contended.pk: True}
    shown = alice_client.get(reverse("runs-compare-data"), {"runs": ids, "contended": "1"}).json()
    assert {r["experiment"]: r["n_seeds"] for r in shown["throughput"]} == {
        twin.experiment_id: 1,
        contended.experiment_id: 1,
    }
