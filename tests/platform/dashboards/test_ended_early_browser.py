"""The comparison page in a real headless Chromium on the operator's probe (test_ended_early): a
run cancelled at step 22 of 40 is listed as ended early, and the summary, the statistics and the
speed-up readout say they left it out. Screenshots land in var/test/screenshots/."""

from __future__ import annotations

import pytest
from dashboard_helpers import ASYNC, SCREENSHOTS, async_run, end_at, rendered
from django.urls import reverse

from experiments.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_cancelled_run_is_listed_and_every_table_says_it_was_left_out(page, live_server, probe):
    cancelled = async_run(probe)
    end_at(cancelled, Run.CANCELLED, 22)
    page.goto(live_server.url + reverse("experiment-compare", args=[probe.pk]))
    rendered(page, metric="eval/accuracy")
    page.locator("#ended-early-runs").scroll_into_view_if_needed()
    page.screenshot(path=SCREENSHOTS / "compare-ended-early.png", full_page=True)

    cell = page.text_content(f"#summary tr[data-preset=grpo] td[data-staleness='{ASYNC}']")
    assert "0.450" in cell and "1 seed, no interval" in cell and "1 ended early, left out" in cell, cell
    schedule = page.text_content("#summary tr[data-preset=grpo] td[data-staleness='sync_offset=1']")
    assert "ended early" not in schedule, schedule

    assert page.is_visible("#ended-early-runs")
    listed = page.text_content(f"#ended-early-runs li[data-run='{cancelled.pk}']")
    assert listed.endswith(f"grpo · {ASYNC} · seed 1: cancelled at step 22 of 40"), listed
    assert page.locator("#ended-early-runs li").count() == 1

    readout = page.text_content(f"#speedups tr[data-preset=grpo][data-staleness='{ASYNC}']")
    assert readout.endswith("1 (1 ended early)"), readout
    iqm = page.text_content("#iqm tr[data-line=grpo]")
    assert "(1 seed, no CI below 5 · 1 ended early, left out)" in iqm, iqm
