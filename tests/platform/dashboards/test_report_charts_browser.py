"""A report's chart block draws what its link shows on the comparison page (in a real Chromium):
small multiples by the link's "panels by" field (the page's default view), or one overlay; a link
with `view=grid&facet=staleness` once published as one overlay of 12 lines."""

from __future__ import annotations

import pytest
from django.urls import reverse
from support import TEST_VAR

from dashboards.models import Report
from dashboards.reports import service

pytestmark = pytest.mark.django_db(transaction=True)


def test_each_chart_block_draws_the_view_its_link_shows(page, live_server, alice, demo):
    base = f"/experiments/{demo.pk}/compare/?metric=eval/accuracy"
    source = "\n\n".join(
        f"{{{{ chart {base}{query} }}}}"
        for query in (
            "&view=grid&facet=staleness",
            "&view=overlay",
            "",
            "&view=grid&facet=preset&colour=staleness",
        )
    )
    report = Report.objects.create(team=demo.team, author=alice, title="Views", source=source)
    service.publish(report, alice)
    page.goto(live_server.url + reverse("report-detail", args=[report.pk]))
    for i in range(4):
        page.wait_for_selector(f".report-chart[data-index='{i}'][data-drawn]")

    def panels(i):
        return page.evaluate(
            """i => [...document.querySelectorAll(`.report-chart[data-index='${i}'] .report-panel`)].map(p => ({
                facet: p.dataset.facet,
                means: p.data.filter(t => t.legendgroup && !t.fill).map(t => [t.name.split(' (')[0], t.line.color]),
            }))""",
            i,
        )

    by_staleness = panels(0)
    assert [p["facet"] for p in by_staleness] == ["on-policy", "sync_offset=2", "offline"]
    assert all(len(p["means"]) == 4 for p in by_staleness), "a line per preset in each panel"
    assert by_staleness[0]["means"][1] == ["grpo", "#d62728"], "the page's colours"
    assert panels(2) == by_staleness, "no view in the link: the page's default, panels by staleness"
    overlay = page.evaluate(
        """() => { const el = document.querySelector(".report-chart[data-index='1']");
            return [el.querySelectorAll('.report-panel').length, el.data.filter(t => !t.fill).length]; }"""
    )
    assert overlay == [0, 12], "one overlay of 4 presets × 3 settings"
    by_preset = panels(3)
    assert [p["facet"] for p in by_preset] == [
        "reinforce",
        "grpo",
        "rec-oneside-nois",
        "rec-oneside-nois-wide",
    ]
    assert len({colour for _, colour in by_preset[0]["means"]}) == 3, "coloured by staleness"
    page.screenshot(path=str(TEST_VAR / "screenshots" / "report-chart-views.png"), full_page=True)
