"""A run's row on the experiment page in a real headless Chromium, redrawn by polling: waiting for
a worker, then preparing the model (a tiny model not cached yet, so it is warm-started), then
training step s of N. Screenshots land in var/test/screenshots/."""

from __future__ import annotations

import shutil

import pytest
from django.conf import settings
from django.urls import reverse
from support import TEST_VAR, TINY_CONFIG

from experiments.sweeps import create_experiment, expand
from rlcore import models

pytestmark = pytest.mark.django_db(transaction=True)

# A model size no other test uses and an unreachable target: the warm start runs its 300 steps.
WARM_START_CONFIG = {
    **TINY_CONFIG,
    "model": {
        "tiny": {
            **TINY_CONFIG["model"]["tiny"],
            "intermediate_size": 72,
            "warmstart_max_steps": 300,
            "warmstart_accuracy": 0.99,
        }
    },
    # Long enough (several seconds even on an idle machine) that the page, polling every 2 s, sees it train.
    "steps": 600,
    "eval_every": 0,
    "checkpoint_every": 0,
}


def test_a_runs_row_shows_the_warm_start_then_training(page, live_server, start_worker, team, alice):
    sweep = expand(WARM_START_CONFIG, ["grpo"], [{}], [0])
    config = sweep.configs[0]
    shutil.rmtree(settings.LAB_CACHE_DIR / f"tiny-{models.tiny_cache_key(config)}", ignore_errors=True)
    experiment = create_experiment(team, alice, "warm start", "", sweep)
    run = experiment.runs.get()
    page.goto(live_server.url + reverse("experiment-detail", args=[experiment.pk]))
    phase = page.locator(f"tr[data-run='{run.pk}'] td.phase")
    assert phase.inner_text().startswith("waiting for a worker")

    start_worker()
    page.wait_for_function(
        f"() => document.querySelector(\"tr[data-run='{run.pk}'] td.phase\").textContent"
        ".includes('preparing the model (first run only): warm start step')",
        timeout=120_000,
    )
    page.screenshot(path=TEST_VAR / "screenshots" / "progress-warm-start.png")
    assert "of at most 300, held-out accuracy" in phase.inner_text()
    page.wait_for_function(
        f"() => /training step \\d+ of 600/.test("
        f"document.querySelector(\"tr[data-run='{run.pk}'] td.phase\").textContent)",
        timeout=120_000,
    )
    page.screenshot(path=TEST_VAR / "screenshots" / "progress-training.png")
    assert "steps" in page.locator("#sweep-progress").inner_text()
