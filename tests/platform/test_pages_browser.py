"""The pages' live parts in a real headless Chromium: the sweep form counts its grid as you
type, and the experiment page refreshes its runs by polling until none is active."""

from __future__ import annotations

import pytest
from conftest import TINY_CONFIG
from django.urls import reverse
from experiments.models import Run
from experiments.sweeps import create_experiment, expand

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_form_counts_the_runs_of_the_grid_while_typing(page, live_server):
    page.goto(live_server.url + reverse("submit-sweep"))
    assert page.text_content("#grid-size") == "This sweep makes 1 run."
    page.check("input[name=presets][value=grpo]")
    page.fill("input[name=sync_offsets]", "8, 32")
    page.fill("input[name=seeds]", "0 1 2")
    assert page.text_content("#grid-size") == "This sweep makes 18 runs."


def test_the_experiment_page_polls_until_no_run_is_active(page, live_server, team, alice):
    experiment = create_experiment(team, alice, "live", "", expand(TINY_CONFIG, ["grpo"], [{}], [0]))
    run = experiment.runs.get()
    page.goto(live_server.url + reverse("experiment-detail", args=[experiment.pk]))
    assert page.text_content(".status-queued") == "queued"
    Run.objects.filter(pk=run.pk).update(status=Run.SUCCEEDED, progress=6, summary={"reward/mean": 0.75})
    page.wait_for_selector(".status-succeeded")
    assert "0.750" in page.text_content("#runs")
    assert page.locator("#runs [data-active=false]").count() == 1
