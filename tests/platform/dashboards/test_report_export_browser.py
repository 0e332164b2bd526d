"""A report with an image from another host in its prose and a chart whose metric name is a link to
that host, in a real headless Chromium: on the site and in its HTML export opened from disk, the
chart draws with its title as text (no `<a>` in Plotly's title, axis titles or legend), and
opening the export sends no request beyond the file itself, breaking no rule of its policy."""

from __future__ import annotations

import pytest
from dashboard_helpers import HOSTILE_METRIC, PIXEL
from django.urls import reverse
from support import TEST_VAR

pytestmark = pytest.mark.django_db(transaction=True)

# Every Content-Security-Policy violation the page reports, kept for the test to read.
RECORD_VIOLATIONS = """
window.violations = [];
document.addEventListener("securitypolicyviolation", (e) =>
  window.violations.push(`${e.violatedDirective} ${e.blockedURI}`));
"""


def chart_as_text(page) -> None:
    """The chart is drawn, its title shows the metric's markup as text, and Plotly drew no link."""
    page.wait_for_selector("div.report-chart[data-drawn]")
    assert int(page.get_attribute("div.report-chart", "data-drawn")) == 8, "a curve and its band per run"
    assert HOSTILE_METRIC in page.text_content("div.report-chart .gtitle")
    assert HOSTILE_METRIC in page.text_content("div.report-chart .g-ytitle")
    assert page.locator("div.report-chart .infolayer a").count() == 0, "no link in a title or the legend"
    assert page.locator('div.report-chart [*|href*="evil.example.com"]').count() == 0


def test_the_chart_title_is_text_on_the_site_and_the_export_loads_nothing_from_another_host(
    page, live_server, browser, hostile_report, client, alice, tmp_path
):
    page.goto(live_server.url + reverse("report-detail", args=[hostile_report.pk]))
    chart_as_text(page)

    client.force_login(alice)
    exported = tmp_path / "report.html"
    exported.write_bytes(client.get(reverse("report-export-html", args=[hostile_report.pk])).content)
    context = browser.new_context()
    requests = []
    context.on("request", lambda request: requests.append(request.url))
    context.add_init_script(RECORD_VIOLATIONS)
    try:
        opened = context.new_page()
        opened.set_default_timeout(20_000)
        opened.goto(exported.as_uri())
        chart_as_text(opened)
        assert opened.locator(".report-prose img").count() == 0
        assert opened.get_attribute(".report-prose a", "href") == PIXEL
        assert requests == [exported.as_uri()], "nothing asked for beyond the file"
        assert opened.evaluate("window.violations") == [], "the file needs nothing its policy forbids"
        opened.screenshot(path=str(TEST_VAR / "screenshots" / "report-export-hostile.png"), full_page=True)
    finally:
        context.close()
