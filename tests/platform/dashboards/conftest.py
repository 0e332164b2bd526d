"""Fixtures of the dashboard tests (their helpers are in dashboard_helpers.py): finished
experiments written straight into the database (`demo`, `probe`) and a published report with
hostile content (`hostile_report`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import pytest
from dashboard_helpers import (
    ASYNC,
    DEMO_PRESETS,
    DEMO_STALENESS,
    HOSTILE_METRIC,
    PIXEL,
    PROBE_FINALS,
    PROBE_STALENESS,
    SCHEDULE,
    configured_for,
    demo_accuracy,
    probe_measured,
)
from sample_experiments import make_finished_experiment
from support import log_points

from dashboards.models import Report
from dashboards.reports import service


@pytest.fixture
def demo(team, alice):
    """An experiment shaped like the paper's claims: 4 presets × 3 staleness settings × 3 seeds, finished."""
    return make_finished_experiment(
        team,
        alice,
        name="demo",
        presets=DEMO_PRESETS,
        staleness=DEMO_STALENESS,
        seeds=(0, 1, 2),
        final_accuracy=demo_accuracy,
    )


@pytest.fixture
def probe(team, alice):
    """The operator's probe, finished, every run measured (`dashboard_helpers`)."""
    experiment = make_finished_experiment(
        team,
        alice,
        name="probe",
        presets=("grpo",),
        staleness=PROBE_STALENESS,
        seeds=(0, 1),
        steps=40,
        eval_every=10,
        final_accuracy=lambda preset, label, seed: PROBE_FINALS[label],
    )
    configured_for(experiment, 40)
    # Measured alone: the schedule 2 s a step, async seed 0 1 s, async seed 1 0.5 s (until it ended).
    walls = {(SCHEDULE, 0): 2.0, (SCHEDULE, 1): 2.0, (ASYNC, 0): 1.0, (ASYNC, 1): 0.5}
    for run in experiment.runs.all():
        run.summary = probe_measured(walls[(run.staleness, run.seed)])
        run.save(update_fields=["summary"])
    return experiment


@pytest.fixture
def hostile_report(team, alice):
    """A published report whose prose shows an image from another host and whose chart plots the
    metric HOSTILE_METRIC (logged by every run of a reinforce, grpo × 2 staleness × 1 seed grid)."""
    grid = make_finished_experiment(team, alice, name="grid", seeds=(0,))
    start = datetime(2025, 1, 1, tzinfo=UTC)
    for i, run in enumerate(grid.runs.order_by("pk")):
        log_points(
            run,
            [
                (HOSTILE_METRIC, step, 0.1 * i + 0.01 * step, start + timedelta(seconds=step))
                for step in range(21)
            ],
        )
    source = (
        f"# Findings\n\n![a pixel]({PIXEL}) Staleness hurts.\n\n"
        f"{{{{ chart /experiments/{grid.pk}/compare/?metric={quote(HOSTILE_METRIC, safe='')} }}}}\n"
    )
    report = Report.objects.create(team=team, author=alice, title="Hostile", source=source)
    service.publish(report, alice)
    return report
