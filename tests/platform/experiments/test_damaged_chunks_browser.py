"""A damaged metric chunk as a person sees it in Chromium: the run page draws the metric with a gap
and lists a note naming it above the charts, and the comparison page says which run it left out.
Screenshots land in var/test/screenshots/."""

from __future__ import annotations

import pytest
from django.db import connection
from django.urls import reverse
from sample_experiments import make_finished_experiment
from support import TEST_VAR

pytestmark = pytest.mark.django_db(transaction=True)

SCREENSHOTS = TEST_VAR / "screenshots"
METRIC = "eval/accuracy"


def test_the_run_page_and_the_comparison_name_a_damaged_metric(page, live_server, team, alice):
    experiment = make_finished_experiment(
        team, alice, presets=("reinforce", "grpo"), staleness=({},), seeds=(0,), steps=1100
    )
    damaged = experiment.runs.get(preset="reinforce")
    with connection.cursor() as cursor:  # the steps 0–1023 of one metric, packed, no longer zlib
        cursor.execute(
            "UPDATE experiments_metricchunk SET value_data = %s WHERE run_id = %s AND name = %s AND chunk = 0",
            [b"\xde\xad\xbe\xef", damaged.pk, METRIC],
        )

    page.goto(live_server.url + reverse("run-detail", args=[damaged.pk]))
    page.wait_for_function("() => Number(document.getElementById('run-curves').dataset.rendered || 0) >= 1")
    note = page.locator("#run-curves-damaged li")
    assert note.count() == 1 and note.is_visible()
    assert note.inner_text().startswith(f"{METRIC}: the points stored for steps 0–1023 are damaged")
    titles = page.evaluate(
        "() => [...document.querySelectorAll('#run-curves .curve')].map(el => el.layout.title.text)"
    )
    assert f"{METRIC} (damaged: a gap)" in titles and "reward/mean" in titles
    page.screenshot(path=SCREENSHOTS / "run-page-damaged-chunk.png", full_page=True)

    page.goto(live_server.url + reverse("experiment-compare", args=[experiment.pk]) + f"?metric={METRIC}")
    warning = page.locator("#provenance-warnings li", has_text=f"Run {damaged.pk} is left out")
    warning.wait_for()
    assert METRIC in warning.inner_text()
    cell = page.locator('#summary tr[data-preset="reinforce"] td[data-staleness="on-policy"]')
    assert cell.inner_text() == "no readable points · 1 left out: damaged points"
    page.screenshot(path=SCREENSHOTS / "compare-damaged-chunk.png", full_page=True)
