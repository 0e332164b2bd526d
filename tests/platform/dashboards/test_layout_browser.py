"""What a person sees fits: in a 1,400 px window the comparison page is no wider than the window
(its wide tables scroll in their own box), and in every chart the title, the tick labels and the
legend stay inside the chart and clear of the axis titles, also with long line labels (runs of
two experiments); the run page shows its status and phase above its charts. Screenshots land in
var/test/screenshots/."""

from __future__ import annotations

import pytest
from dashboard_helpers import rendered
from django.urls import reverse
from django.utils import timezone
from sample_experiments import make_finished_experiment
from support import TEST_VAR

from experiments.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

SCREENSHOTS = TEST_VAR / "screenshots"
PRESETS = ("reinforce", "grpo", "rec-oneside-nois", "rec-oneside-nois-wide")
STALENESS = ({}, {"sync_offset": 2}, {"sync_interval": 4}, {"offline": True})

# Per chart: its box, and the boxes of its title, x axis title, legend and tick labels.
BOXES_JS = """selector => [...document.querySelectorAll(selector)].map(chart => {
    const box = el => { if (!el) return null; const r = el.getBoundingClientRect();
                        return r.width && r.height ? {l: r.left, r: r.right, t: r.top, b: r.bottom} : null; };
    return {
        id: chart.id || chart.dataset.staleness,
        chart: box(chart.querySelector('.main-svg')),
        title: box(chart.querySelector('.gtitle')),
        xtitle: box(chart.querySelector('.g-xtitle')),
        legend: box(chart.querySelector('.legend')),
        ticks: [...chart.querySelectorAll('.xtick text, .ytick text')].map(box).filter(Boolean),
        layout: JSON.stringify({title: chart.layout && chart.layout.title, margin: chart.layout && chart.layout.margin, height: chart.layout && chart.layout.height}),
    };
})"""


def inside(inner, outer, slack=1) -> bool:
    return (
        inner["l"] >= outer["l"] - slack
        and inner["r"] <= outer["r"] + slack
        and inner["t"] >= outer["t"] - slack
        and inner["b"] <= outer["b"] + slack
    )


def apart(a, b) -> bool:
    return a["r"] <= b["l"] or b["r"] <= a["l"] or a["b"] <= b["t"] or b["b"] <= a["t"]


def assert_charts_fit(page, selector: str) -> int:
    charts = page.evaluate(BOXES_JS, selector)
    for chart in charts:
        name, box = chart["id"], chart["chart"]
        assert box is not None, name
        assert chart["title"] and inside(chart["title"], box), (
            f"{name}: the title is clipped ({chart['layout']})"
        )
        for tick in chart["ticks"]:
            assert inside(tick, box), f"{name}: a tick label is cut off at the chart's edge"
        if chart["legend"]:
            assert inside(chart["legend"], box), f"{name}: the legend spills out of the chart"
            if chart["xtitle"]:
                assert apart(chart["legend"], chart["xtitle"]), f"{name}: the legend covers the axis title"
    return len(charts)


def assert_page_fits(page) -> None:
    width = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], f"the page is {width[0]} px wide in a {width[1]} px window"
    for table in ("#summary", "#drops"):
        scroller = page.evaluate(
            f"() => getComputedStyle(document.querySelector('{table}').parentElement).overflowX"
        )
        assert scroller == "auto", f"{table} scrolls in a box of its own"


def assert_comparison_fits(page) -> None:
    """The page no wider than the window; its curve panels and trade-off charts each fit."""
    assert_page_fits(page)
    assert assert_charts_fit(page, "#plots .panel") == 4
    # No run measured its CPU seconds: that chart has nothing to draw and is left out, not drawn empty.
    assert page.is_hidden("#throughput-cpu")
    assert assert_charts_fit(page, "#trade-off > div:not([hidden])") == 3


def test_the_comparison_page_and_its_charts_fit_a_1400_px_window(page, live_server, team, alice):
    experiment = make_finished_experiment(team, alice, name="demo", presets=PRESETS, staleness=STALENESS)
    page.goto(live_server.url + reverse("experiment-compare", args=[experiment.pk]))
    rendered(page, metric="eval/accuracy")
    page.screenshot(path=SCREENSHOTS / "compare-layout.png", full_page=True)
    assert_comparison_fits(page)
    assert assert_charts_fit(page, "#scatter") == 1


def test_charts_of_runs_of_two_experiments_fit_with_their_long_labels(page, live_server, team, alice):
    first = make_finished_experiment(
        team, alice, name="a first experiment with a long name", staleness=STALENESS
    )
    second = make_finished_experiment(
        team, alice, name="another experiment, named at length", staleness=STALENESS
    )
    ids = ",".join(
        str(pk) for pk in Run.objects.filter(experiment__in=[first, second]).values_list("pk", flat=True)
    )
    page.goto(f"{live_server.url}{reverse('runs-compare')}?runs={ids}")
    rendered(page, metric="eval/accuracy")
    page.screenshot(path=SCREENSHOTS / "compare-two-experiments.png", full_page=True)
    assert_comparison_fits(page)


def test_the_run_page_shows_status_and_phase_above_its_charts(page, live_server, team, alice):
    experiment = make_finished_experiment(team, alice, presets=("grpo",), staleness=({},), seeds=(0,))
    run = experiment.runs.get()
    page.goto(live_server.url + reverse("run-detail", args=[run.pk]))
    page.wait_for_selector("#run-curves .curve")
    page.screenshot(path=SCREENSHOTS / "run-page-top.png")
    status, curves = (page.locator(s).bounding_box()["y"] for s in ("#run-status", "#run-curves"))
    assert status < curves and status < 400, "the status is on the first screen, above the charts"
    assert "Status succeeded" in page.inner_text("#run-status")


def page_width(page) -> list[int]:
    return page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")


def test_the_experiment_page_fits_900_px_and_then_and_now_fits_1280_px(page, live_server, team, alice):
    """At 900 px the experiment page's runs table scrolls in its own box; a report's "compare with
    current data" page keeps its long links inside 1,280 px and shades only the changed rows."""
    from dashboards.models import Report
    from dashboards.reports import service

    experiment = make_finished_experiment(team, alice, name="demo", presets=PRESETS, staleness=STALENESS)
    page.set_viewport_size({"width": 900, "height": 900})
    page.goto(live_server.url + reverse("experiment-detail", args=[experiment.pk]))
    page.wait_for_selector("#sweep-runs tr td")
    width = page_width(page)
    assert width[0] <= width[1], f"the experiment page is {width[0]} px wide in a {width[1]} px window"

    link = (
        f"/experiments/{experiment.pk}/compare/?metric=eval/accuracy&x=step&band=ci&rule=mean_last_k&k=10"
        "&delta=0.02&view=grid&facet=staleness&colour=preset&smooth=0.5&contended=0"
    )
    report = Report.objects.create(team=team, author=alice, title="Then", source=f"{{{{ table {link} }}}}")
    service.publish(report, alice)
    Run.objects.filter(pk=experiment.runs.first().pk).update(archived=timezone.now())
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(live_server.url + reverse("report-current", args=[report.pk]))
    page.wait_for_selector("section.current-block")
    width = page_width(page)
    assert width[0] <= width[1], f"the then-and-now page is {width[0]} px wide in a {width[1]} px window"
    shading = page.evaluate(
        """() => [getComputedStyle(document.querySelector('section.current-block')).backgroundColor,
                  [...document.querySelectorAll('tr.changed')].map(tr => getComputedStyle(tr).backgroundColor)]"""
    )
    assert shading[0] == "rgba(0, 0, 0, 0)", "the block itself is not shaded"
    assert shading[1] and set(shading[1]) == {"rgb(255, 244, 214)"}, "the changed rows are"
    page.screenshot(path=SCREENSHOTS / "report-then-and-now.png", full_page=True)
