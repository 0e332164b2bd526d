"""The run page in a real headless Chromium: one small chart per metric the run logged, headline
metrics first, names shown as text; other runs' completions of the same prompts side by side,
escaped; and a running run's curves redrawn by polling, without reloading. Screenshots land in
var/test/screenshots/."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from sample_experiments import START, make_finished_experiment
from support import TEST_VAR, log_points

from experiments.models import Completion, Run

pytestmark = pytest.mark.django_db(transaction=True)

SCREENSHOTS = TEST_VAR / "screenshots"
SCRIPT = "<script>alert(1)</script>"
ODD_NAME = "<b>odd</b> & <img src=x onerror=window.pwned=1>"


def rendered(page, draws: int = 1) -> None:
    """Wait until the curves have been drawn at least `draws` times."""
    page.wait_for_function(
        "n => Number(document.getElementById('run-curves').dataset.rendered || 0) >= n", arg=draws
    )


def curve_metrics(page) -> list[str]:
    """The metrics of the run page's charts, in the order they are drawn."""
    return page.evaluate(
        "() => [...document.querySelectorAll('#run-curves .curve')].map(el => el.dataset.metric)"
    )


def test_a_finished_run_shows_its_curves_and_other_runs_completions_as_text(page, live_server, team, alice):
    experiment = make_finished_experiment(team, alice, seeds=(0,), steps=20)
    runs = {(r.preset, r.staleness): r for r in experiment.runs.all()}
    run = runs["grpo", "on-policy"]
    log_points(
        run,
        [
            (name, step, value, START + timedelta(seconds=step))
            for name, values in {ODD_NAME: [1.0, float("nan"), 3.0]}.items()
            for step, value in zip((0, 10, 20), values, strict=True)
        ],
    )
    Completion.objects.create(run=run, step=20, prompt="12+34=", completion="46", reward=1.0)
    Completion.objects.create(
        run=runs["reinforce", "on-policy"], step=20, prompt="12+34=", completion=SCRIPT, reward=0.0
    )
    dialogs = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))

    page.goto(live_server.url + reverse("run-detail", args=[run.pk]))
    rendered(page)
    page.screenshot(path=SCREENSHOTS / "run-page.png", full_page=True)

    assert page.locator("#run-curves .js-plotly-plot").count() == 7
    assert curve_metrics(page) == [
        "reward/mean",
        "eval/accuracy",
        "kl/init",
        ODD_NAME,
        "response_length/mean",
        "time/step_s",
        "tokens_per_s",
    ]
    titles = page.evaluate(
        "() => [...document.querySelectorAll('#run-curves .curve')].map(el => el.querySelector('.gtitle').textContent)"
    )
    assert titles[3] == ODD_NAME, "the metric name is shown as text, not markup"
    curve = page.evaluate(
        "name => { const el = [...document.querySelectorAll('#run-curves .curve')].find(e => e.dataset.metric === name);"
        " return {x: el.data[0].x, y: el.data[0].y}; }",
        ODD_NAME,
    )
    assert curve == {"x": [0, 10, 20], "y": [1, None, 3]}
    assert page.text_content("#run-curves-status") == "7 metrics"

    table = page.locator("#same-prompts table")
    assert table.count() == 1
    rows = table.locator("tr[data-run]")
    assert rows.count() == 2
    assert "(this run)" in rows.nth(0).text_content()
    other = rows.nth(1)
    assert other.get_attribute("data-run") == str(runs["reinforce", "on-policy"].pk)
    assert other.locator("code").text_content() == SCRIPT
    assert page.locator("#same-prompts script, #run-curves img").count() == 0
    assert dialogs == [] and page.evaluate("() => window.pwned") is None


def test_a_running_runs_curves_are_polled_without_reloading(page, live_server, team, alice):
    experiment = make_finished_experiment(
        team, alice, presets=("grpo",), staleness=({},), seeds=(0,), steps=4
    )
    run = experiment.runs.get()
    Run.objects.filter(pk=run.pk).update(status=Run.RUNNING)
    page.goto(live_server.url + reverse("run-detail", args=[run.pk]))
    rendered(page)
    assert "refreshing" in page.text_content("#run-curves-status")
    assert page.locator("#run-curves .js-plotly-plot").count() == 6
    page.evaluate("() => { window.notReloaded = true; }")
    log_points(
        run,
        [
            ("reward/mean", 5, 2.0, START + timedelta(seconds=5)),
            ("kl/behavior", 5, 0.1, START + timedelta(seconds=5)),
        ],
    )
    Run.objects.filter(pk=run.pk).update(status=Run.SUCCEEDED, progress=5)
    page.wait_for_function(
        "() => !document.getElementById('run-curves-status').textContent.includes('refreshing')",
    )
    assert page.evaluate("() => window.notReloaded") is True
    assert curve_metrics(page) == [
        "reward/mean",
        "eval/accuracy",
        "kl/init",
        "kl/behavior",
        "response_length/mean",
        "time/step_s",
        "tokens_per_s",
    ]
    assert (
        page.evaluate(
            "() => document.querySelector('#run-curves .curve[data-metric=\"reward/mean\"]').data[0].x.at(-1)"
        )
        == 5
    )
    assert page.locator("#run-curves .js-plotly-plot").count() == 7
    draws = int(page.get_attribute("#run-curves", "data-rendered"))
    page.wait_for_timeout(3500)
    assert int(page.get_attribute("#run-curves", "data-rendered")) == draws, "polling stopped"


def test_a_constant_small_metric_and_a_one_point_metric_are_visible(page, live_server, team, alice):
    run = make_finished_experiment(
        team, alice, presets=("grpo",), staleness=({},), seeds=(0,), steps=3
    ).runs.get()
    log_points(
        run,
        [
            *(("lr", step, 3e-5, START + timedelta(seconds=step)) for step in (1, 2, 3)),
            ("eval/kl_init", 0, 0.26, START),
        ],
    )
    page.goto(live_server.url + reverse("run-detail", args=[run.pk]))
    rendered(page)
    chart = "name => { const el = document.querySelector(`#run-curves .curve[data-metric='${name}']`); return {range: el.layout.yaxis.range, autorange: el._fullLayout.yaxis.range, mode: el.data[0].mode}; }"
    lr = page.evaluate(chart, "lr")
    lo, hi = lr["range"]
    assert lo < 3e-5 < hi and lo > 0, "drawn around its value, not as a flat line at 0"
    one = page.evaluate(chart, "eval/kl_init")
    assert "markers" in one["mode"], "a single point is drawn as a marker"
    assert one["autorange"][0] < 0.26 < one["autorange"][1]
