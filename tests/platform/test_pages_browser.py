"""The pages' live parts in a real headless Chromium: the sweep form counts its grid as you
type, and the experiment page refreshes its runs by polling until none is active."""

from __future__ import annotations

import shutil

import pytest
from conftest import TINY_CONFIG
from django.db import connections
from django.urls import reverse
from experiments.models import Run
from experiments.sweeps import create_experiment, expand

pytestmark = pytest.mark.django_db(transaction=True)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Only the live server on 127.0.0.1: no update checks or other background traffic.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


@pytest.fixture
def page(live_server, alice, monkeypatch):
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop in this thread; the test's own ORM calls are still synchronous.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.set_default_timeout(20_000)
        page.goto(live_server.url + reverse("login"))
        page.fill("input[name=username]", "alice")
        page.fill("input[name=password]", "alice-password-1")
        page.click("button[type=submit]")
        page.wait_for_url(live_server.url + reverse("experiment-list"))
        yield page
        browser.close()
        # Code under Playwright's sync API runs in a greenlet with its own Django connections.
        connections.close_all()


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
