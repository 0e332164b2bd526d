"""Reports in a real headless Chromium: written and published from the editor, its chart drawn and
its hostile Markdown inert; the exported HTML file opened with every network request refused,
its chart drawn from the data inline. Screenshots land in var/test/screenshots/."""

from __future__ import annotations

import pytest
from dashboard_helpers import MALICIOUS
from django.urls import reverse
from support import TEST_VAR

from dashboards.models import Report

pytestmark = pytest.mark.django_db(transaction=True)


def drawn(page, selector=".report-chart[data-drawn]"):
    page.wait_for_selector(selector)
    assert int(page.get_attribute(selector, "data-drawn")) > 0
    assert page.locator(f"{selector} .main-svg").count() > 0, "Plotly drew an SVG"


def inert(page):
    """None of MALICIOUS's scripts, javascript: link or event attributes ran."""
    page.click("text=click")  # the javascript: link is text: clicking it does nothing
    page.hover("text=Hello")
    assert page.evaluate("window.pwned") is None
    assert page.locator(".report-prose script, .report-prose img, .report-prose [onclick]").count() == 0


def test_a_report_is_written_published_and_exported_to_open_offline(
    page, live_server, demo, browser, tmp_path
):
    page.goto(live_server.url + reverse("report-list"))
    page.fill("#report-title", "GRPO under staleness")
    page.click("#report-create")
    page.wait_for_selector("#report-source")
    link = f"{live_server.url}/experiments/{demo.pk}/compare/?metric=eval/accuracy"
    page.fill(
        "#report-source", f"{MALICIOUS}\n\n{{{{ chart {link} }}}}\n\n{{{{ table {link}&rule=last }}}}\n"
    )
    page.click("#report-save")
    page.wait_for_selector(".report-chart")
    drawn(page)  # the preview, from the data now
    inert(page)
    page.click("#report-publish")
    page.wait_for_selector("#report-version")
    assert page.text_content("#report-version") == "version 1"
    drawn(page)
    inert(page)
    rows = page.locator(".report-summary tr[data-line]")
    assert rows.count() == 12
    page.screenshot(path=str(TEST_VAR / "screenshots" / "report-published.png"), full_page=True)
    report = Report.objects.get(title="GRPO under staleness")
    assert report.versions.get().blocks[0]["link"] == f"/experiments/{demo.pk}/compare/?metric=eval/accuracy"

    with page.expect_download() as download:
        page.click("#report-export-html")
    exported = tmp_path / "report.html"
    download.value.save_as(exported)

    offline = browser.new_context(offline=True)
    requests = []

    def refuse(route):
        """The file itself loads; anything else it asked for would be refused (and counted)."""
        if route.request.url == exported.as_uri():
            return route.continue_()
        requests.append(route.request.url)
        return route.abort()

    offline.route("**/*", refuse)
    try:
        opened = offline.new_page()
        opened.goto(exported.as_uri())
        drawn(opened)
        inert(opened)
        assert opened.text_content("#report-title") == "GRPO under staleness"
        assert opened.locator(".report-summary tr[data-line]").count() == 12
        assert requests == [], "it asked for nothing beyond itself"
        opened.screenshot(path=str(TEST_VAR / "screenshots" / "report-exported-offline.png"), full_page=True)
    finally:
        offline.close()
