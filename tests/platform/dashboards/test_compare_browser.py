"""The comparison dashboard in a real headless Chromium, on a finished 2 presets × 2 staleness
settings × 2 seeds experiment written straight into the database: the grid draws one line and
one band per preset in each staleness panel, the controls change the traces and the URL, the URL
reproduces the view, the CSV links download parseable files, the throughput charts beside the
degradation plot draw one line per preset, and a running experiment is polled.
Screenshots land in var/test/screenshots/."""

from __future__ import annotations

import csv
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlencode

import pytest
from dashboard_helpers import (
    CELLS,
    DEMO_PRESETS,
    DEMO_STALENESS,
    SCREENSHOTS,
    demo_accuracy,
    measured,
    rendered,
)
from django.urls import reverse
from sample_experiments import START, make_finished_experiment
from support import log_points

from experiments.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

# Per panel: [kind, preset] of every trace, and the mean lines' colours.
TRACES_JS = """() => [...document.querySelectorAll('#plots .panel')].map(panel => ({
    staleness: panel.dataset.staleness || null,
    traces: panel.data.map(t => ({kind: t.meta.kind, preset: t.meta.preset, staleness: t.meta.staleness || null,
                                  colour: t.line.color || null, dash: t.line.dash || null, x: t.x, y: t.y})),
}))"""


def mean_line(panels, preset: str, staleness: str) -> dict:
    return next(
        t
        for panel in panels
        for t in panel["traces"]
        if t["kind"] == "mean" and t["preset"] == preset and t["staleness"] == staleness
    )


def download(page, selector: str) -> list[dict[str, str]]:
    with page.expect_download() as info:
        page.click(selector)
    return list(csv.DictReader(Path(info.value.path()).open()))


def test_the_grid_controls_permalink_and_csv_of_a_finished_experiment(page, live_server, team, alice):
    experiment = make_finished_experiment(team, alice)
    page.goto(live_server.url + reverse("experiment-detail", args=[experiment.pk]))
    page.click("#compare-link")
    # How fast it gets there is bench/dashboard.py's business; tests never time anything.
    rendered(page, metric="eval/accuracy", x="step", band="std", view="grid")
    page.select_option("select[name=metric]", "reward/mean")
    rendered(page, metric="reward/mean")
    page.screenshot(path=SCREENSHOTS / "compare-grid.png", full_page=True)

    panels = page.evaluate(TRACES_JS)
    assert [p["staleness"] for p in panels] == ["on-policy", "sync_offset=2"]
    for panel in panels:
        kinds = sorted((t["kind"], t["preset"]) for t in panel["traces"])
        assert kinds == sorted(
            [(kind, preset) for preset in ("reinforce", "grpo") for kind in ("mean", "band-lo", "band-hi")]
        )
        colours = {t["preset"]: t["colour"] for t in panel["traces"] if t["kind"] == "mean"}
        assert colours == {"reinforce": "#1f77b4", "grpo": "#d62728"}, "one colour per preset everywhere"
    ranges = page.evaluate(
        "() => [...document.querySelectorAll('#plots .panel')].map(p => p.layout.yaxis.range)"
    )
    assert ranges[0] == ranges[1], "small multiples share their y range"
    line = mean_line(panels, "grpo", "sync_offset=2")
    assert line["x"][-1] == 20 and line["y"][-1] == pytest.approx(0.675)

    assert page.text_content("#summary tr[data-preset=reinforce] td[data-staleness=on-policy]") == (
        "0.5250 [0.5000, 0.5500] min–max · 2 seeds, no CI below 5"
    )
    degradation = page.evaluate("() => document.getElementById('degradation').data.map(t => [t.name, t.y])")
    assert [name for name, _ in degradation] == ["reinforce", "grpo"]
    assert [y for _, y in degradation] == [pytest.approx([0.525, 0.425]), pytest.approx([0.775, 0.675])]
    # Throughput next to the degradation plot: one trace per preset in each chart, from the step times.
    throughput = page.evaluate(
        """() => ['throughput-steps', 'throughput-tokens'].map(id => document.getElementById(id).data.map(
            t => [t.meta.kind, t.name, t.y, t.error_y.array.length]))"""
    )
    assert throughput[0] == [
        ["steps_per_hour", "reinforce", pytest.approx([6000, 3000]), 2],
        ["steps_per_hour", "grpo", pytest.approx([4000, 2000]), 2],
    ]
    assert [(kind, name, len(y)) for kind, name, y, _ in throughput[1]] == [
        ("tokens_per_s", "reinforce", 2),
        ("tokens_per_s", "grpo", 2),
    ]
    scatter = page.evaluate("() => document.getElementById('scatter').data.map(t => [t.name, t.x.length])")
    assert scatter == [["reinforce", 4], ["grpo", 4]]

    page.select_option("select[name=metric]", "kl/init")
    rendered(page, metric="kl/init")
    assert mean_line(page.evaluate(TRACES_JS), "grpo", "sync_offset=2")["y"][-1] == pytest.approx(0.4)
    page.select_option("select[name=x]", "samples")
    rendered(page, metric="kl/init", x="samples")
    assert mean_line(page.evaluate(TRACES_JS), "grpo", "sync_offset=2")["x"][-1] == 320
    page.select_option("select[name=band]", "none")
    rendered(page, band="none")
    assert {t["kind"] for p in page.evaluate(TRACES_JS) for t in p["traces"]} == {"mean"}
    assert "metric=kl%2Finit" in page.url and "x=samples" in page.url and "band=none" in page.url

    rows = download(page, "#csv-curves")
    assert len(rows) == 4 * 21 and set(rows[0]) == {
        "preset",
        "staleness",
        "samples",
        "mean",
        "lo",
        "hi",
        "n_seeds",
    }
    assert float(next(r for r in rows if r["samples"] == "320" and r["preset"] == "grpo")["mean"]) > 0
    summary = download(page, "#csv-summary")
    assert [(r["preset"], r["staleness"], r["n_seeds"]) for r in summary][0] == (
        "reinforce",
        "on-policy",
        "2",
    )
    assert float(summary[-1]["value"]) == pytest.approx(0.4)

    page.select_option("select[name=band]", "ci")
    page.select_option("select[name=metric]", "reward/mean")
    page.select_option("select[name=view]", "overlay")
    rendered(page, metric="reward/mean", band="ci", view="overlay")
    page.screenshot(path=SCREENSHOTS / "compare-overlay.png", full_page=True)
    [overlay] = page.evaluate(TRACES_JS)
    means = [t for t in overlay["traces"] if t["kind"] == "mean"]
    assert len(means) == 4 and len(overlay["traces"]) == 12
    assert {(t["preset"], t["staleness"]): (t["colour"], t["dash"]) for t in means} == {
        ("reinforce", "on-policy"): ("#1f77b4", "solid"),
        ("reinforce", "sync_offset=2"): ("#1f77b4", "dash"),
        ("grpo", "on-policy"): ("#d62728", "solid"),
        ("grpo", "sync_offset=2"): ("#d62728", "dash"),
    }

    # EMA with weight 0.5 over the mean line 0.025, 0.05, … of reinforce on-policy: a = 0.0125, then
    # 0.5 × 0.0125 + 0.5 × 0.05, each divided by 1 − 0.5^t.
    page.eval_on_selector(
        "input[name=smooth]",
        "el => { el.value = '0.5'; el.dispatchEvent(new Event('input', {bubbles: true})); }",
    )
    rendered(page, smooth="0.5")
    smoothed = mean_line(page.evaluate(TRACES_JS), "reinforce", "on-policy")["y"]
    assert smoothed[0] == pytest.approx(0.025) and smoothed[1] == pytest.approx(
        (0.5 * 0.0125 + 0.5 * 0.05) / 0.75
    )

    permalink = page.url
    view = page.evaluate(TRACES_JS)
    other = page.context.new_page()
    other.goto(permalink)
    rendered(other, metric="reward/mean", band="ci", view="overlay", x="samples", smooth="0.5")
    assert other.evaluate(TRACES_JS) == view
    assert other.input_value("select[name=x]") == "samples"
    other.close()


def test_a_running_experiment_is_polled_without_reloading(page, live_server, team, alice):
    experiment = make_finished_experiment(team, alice, seeds=(0,), steps=4)
    run = experiment.runs.get(preset="grpo", staleness="on-policy")
    Run.objects.filter(pk=run.pk).update(status=Run.RUNNING)
    page.goto(live_server.url + reverse("experiment-compare", args=[experiment.pk]) + "?metric=reward/mean")
    rendered(page, metric="reward/mean")
    assert "some still running" in page.text_content("#status")
    cell = page.text_content("#summary tr[data-preset=grpo] td[data-staleness=on-policy]")
    assert "1 seed, no interval" in cell and "1 still running (partial)" in cell
    page.evaluate("() => { window.notReloaded = true; }")
    log_points(run, [("reward/mean", 5, 2.0, START + timedelta(seconds=5))])
    Run.objects.filter(pk=run.pk).update(status=Run.SUCCEEDED)
    page.wait_for_function(
        """() => [...document.querySelectorAll('#plots .panel')].some(p => p.data.some(
            t => t.meta.kind === 'mean' && t.meta.preset === 'grpo' && t.x[t.x.length - 1] === 5))""",
    )
    assert page.evaluate("() => window.notReloaded") is True
    page.wait_for_function("() => !document.getElementById('status').textContent.includes('still running')")


def test_a_metric_name_from_the_url_is_shown_as_text(page, live_server, team, alice):
    experiment = make_finished_experiment(team, alice, seeds=(0,), steps=2)
    metric = "<img src=x onerror=window.pwned=1>"
    page.goto(
        live_server.url
        + reverse("experiment-compare", args=[experiment.pk])
        + "?"
        + urlencode({"metric": metric})
    )
    rendered(page, metric=metric)
    assert page.input_value("select[name=metric]") == metric
    assert page.evaluate("() => window.pwned") is None
    assert page.locator("#plots img, #summary img").count() == 0
    assert metric in page.text_content("#summary")


def test_runs_picked_from_two_experiments_share_one_dashboard_and_permalink(page, live_server, team, alice):
    first = make_finished_experiment(team, alice, name="first", seeds=(0,))
    second = make_finished_experiment(team, alice, name="second", presets=("grpo",), seeds=(0, 1))
    page.goto(live_server.url + reverse("run-list"))
    page.select_option("#filters select[name=preset]", "grpo")
    page.click("#filters button")
    page.wait_for_url("**preset=grpo**")
    page.check("#select-all")
    page.click("#compare-selected")
    rendered(page, metric="eval/accuracy", view="grid")
    page.screenshot(path=SCREENSHOTS / "compare-picked-runs.png", full_page=True)
    picked = sorted(Run.objects.filter(preset="grpo").values_list("pk", flat=True))
    assert f"runs={'%2C'.join(map(str, picked))}" in page.url

    panels = page.evaluate(
        """() => [...document.querySelectorAll('#plots .panel')].map(p => p.data
            .filter(t => t.meta.kind === 'mean').map(t => [t.meta.line, t.line.color, t.line.dash]))"""
    )
    lines = [f"grpo · #{first.pk} first", f"grpo · #{second.pk} second"]
    # grpo alone on the page: the first colour.
    assert panels == [[[lines[0], "#1f77b4", "solid"], [lines[1], "#1f77b4", "dash"]]] * 2
    assert page.text_content(f"#summary tr[data-line='{lines[1]}'] td[data-staleness=on-policy]").endswith(
        "· 2 seeds, no CI below 5"
    )
    rows = download(page, "#csv-summary")
    assert {(r["experiment"], r["n_seeds"]) for r in rows} == {(str(first.pk), "1"), (str(second.pk), "2")}

    page.select_option("select[name=metric]", "kl/init")
    rendered(page, metric="kl/init")
    other = page.context.new_page()
    other.goto(page.url)
    rendered(other, metric="kl/init")
    assert other.evaluate(TRACES_JS) == page.evaluate(TRACES_JS)
    other.close()


def test_charts_download_as_png_and_svg_from_the_plotly_toolbar(page, live_server, team, alice):
    experiment = make_finished_experiment(team, alice, seeds=(0,), steps=3)
    page.goto(live_server.url + reverse("experiment-compare", args=[experiment.pk]) + "?metric=kl/init")
    rendered(page, metric="kl/init")
    panel = page.locator("#plots .panel").first
    panel.hover()
    downloads = {}
    for title in ("Download plot as a PNG", "Download plot as SVG"):
        with page.expect_download() as info:
            panel.locator(f'.modebar-btn[data-title="{title}"]').click()
        downloads[info.value.suggested_filename] = Path(info.value.path()).read_bytes()
    assert sorted(downloads) == [
        "kl-init-step-staleness-on-policy.png",
        "kl-init-step-staleness-on-policy.svg",
    ]
    assert downloads["kl-init-step-staleness-on-policy.png"].startswith(b"\x89PNG")
    assert downloads["kl-init-step-staleness-on-policy.svg"].lstrip().startswith(b"<svg")


def test_compared_staleness_settings_read_from_on_policy_to_the_stalest(page, live_server, team, alice):
    make_finished_experiment(
        team, alice, name="odd order", staleness=({"sync_offset": 4}, {}, {"sync_offset": 2}), seeds=(0,)
    )
    page.goto(live_server.url + reverse("run-list"))
    page.check("#select-all")
    page.click("#compare-selected")
    rendered(page, metric="eval/accuracy", view="grid")
    expected = ["on-policy", "sync_offset=2", "sync_offset=4"]
    panels = page.evaluate(
        "() => [...document.querySelectorAll('#plots .panel')].map(p => p.dataset.staleness)"
    )
    assert panels == expected
    # On the degradation plot each setting sits at its schedule's mean lag over the config's 6 steps
    # (lags min(t − 1, d): 0 1 2 2 2 2 and 0 1 2 3 4 4), labelled by name.
    degradation_x = page.evaluate("() => document.getElementById('degradation').data.map(t => t.x)")
    assert degradation_x and all(x == [0, 9 / 6, 14 / 6] for x in degradation_x)
    ticks = page.evaluate("() => document.getElementById('degradation').layout.xaxis.ticktext")
    assert ticks == expected


def test_the_trade_off_table_and_chart_of_a_mixed_sweep_with_a_contended_run(page, live_server, team, alice):
    finals = {"on-policy": 0.6, "sync_offset=2": 0.55, "async ≤ 2": 0.5, "sync_offset=2 (distributed)": 0.55}
    experiment = make_finished_experiment(
        team,
        alice,
        name="mixed",
        presets=("reinforce", "grpo"),
        staleness=CELLS,
        seeds=(0, 1),
        final_accuracy=lambda preset, label, seed: finals[label],
    )
    for run in experiment.runs.all():
        wall = 1.0 if run.staleness == "async ≤ 2" else 2.0
        contended = (run.preset, run.staleness, run.seed) == ("grpo", "async ≤ 2", 1)
        run.summary = measured(wall / (4 if contended else 1), 1.0, contended=contended)
        run.save(update_fields=["summary"])
    contended_run = experiment.runs.get(preset="grpo", staleness="async ≤ 2", seed=1)

    page.goto(live_server.url + reverse("experiment-compare", args=[experiment.pk]))
    rendered(page, metric="eval/accuracy", contended="0")
    page.locator("#speedups").scroll_into_view_if_needed()
    page.screenshot(path=SCREENSHOTS / "compare-speedups.png", full_page=True)
    row = page.locator(
        "#speedups tr[data-preset=reinforce][data-staleness='async ≤ 2'][data-reference=on-policy]"
    )
    text = row.text_content()
    assert "-0.100 [-0.100, -0.100] min–max · 2 seeds" in text, text
    assert "2.00× [2.00×, 2.00×] min–max · 2 seed pairs, no CI below 5" in text, text
    assert text.endswith("1.00 / 2.000.02 / 0.02none"), text  # s per step, outside load, runs left out
    grpo = page.text_content(
        "#speedups tr[data-preset=grpo][data-staleness='async ≤ 2'][data-reference=on-policy]"
    )
    assert "2.00× · 1 seed pair, no interval" in grpo and "1 (contended or not measured)" in grpo, grpo
    distributed = page.text_content(
        "#speedups tr[data-preset=grpo][data-staleness='sync_offset=2 (distributed)']"
    )
    assert "1.00× [1.00×, 1.00×]" in distributed and "sync_offset=2 (its own schedule)" in distributed
    chart = page.evaluate(
        "() => document.getElementById('speedup-chart').data.map(t => ({preset: t.meta.preset, x: t.x, y: t.y}))"
    )
    reinforce = next(t for t in chart if t["preset"] == "reinforce")
    assert sorted(zip(reinforce["x"], reinforce["y"], strict=True)) == [
        (1.0, 0.0),
        (2.0, pytest.approx(-0.1)),
        (2.0, pytest.approx(-0.05)),
    ]
    flagged = page.locator(f"#contended-runs li[data-run='{contended_run.pk}']")
    assert flagged.is_visible()
    assert "left out of the throughput and the speed-ups" in flagged.text_content()

    page.select_option("select[name=contended]", "1")
    rendered(page, contended="1")
    grpo = page.text_content(
        "#speedups tr[data-preset=grpo][data-staleness='async ≤ 2'][data-reference=on-policy]"
    )
    assert "min–max · 2 seed pairs" in grpo and "4.00×" in grpo, grpo
    assert "counted" in page.text_content(f"#contended-runs li[data-run='{contended_run.pk}']")


def test_the_staleness_answer_drop_table_findings_and_the_template_link(page, live_server, team, alice):
    experiment = make_finished_experiment(
        team,
        alice,
        presets=DEMO_PRESETS,
        staleness=DEMO_STALENESS,
        seeds=(0, 1, 2),
        final_accuracy=demo_accuracy,
    )
    page.goto(live_server.url + reverse("experiment-compare", args=[experiment.pk]))
    rendered(page, metric="eval/accuracy", delta="0.02")
    row = page.text_content("#drops tr[data-preset=reinforce]")
    assert "-0.200 [-0.200, -0.200]" in row and row.endswith("on-policy4"), row
    # What every change, tolerance and rank rests on, said once (all cells have 3 seed pairs).
    assert page.text_content("#drops caption") == (
        "Every change and verdict below rests on 3 seed pairs: their min–max, no CI below 5."
    )
    verdicts = page.eval_on_selector_all("#findings > li", "items => items.map(li => li.dataset.verdict)")
    reasons = page.text_content("#findings > li[data-verdict] .reasons")
    assert "rec-oneside-nois − reinforce: supports: within ±δ (both one-sided tests)" in reasons
    assert verdicts == ["support", "support", "support"]
    assert "would tell it from 0 (two-sided α 0.05, power 0.8)" in page.text_content("#ties")
    symbols = page.evaluate("() => document.getElementById('scatter').data[0].marker.symbol")
    assert symbols[:3] == ["circle", "square", "diamond"] or set(symbols) == {"circle", "square", "diamond"}
    assert page.evaluate("() => document.getElementById('degradation').layout.scattermode") == "group"
    page.fill("input[name=delta]", "0.2")
    rendered(page, delta="0.2")
    assert page.text_content("#drops tr[data-preset=reinforce]").endswith("sync_offset=24")
    page.goto(live_server.url + reverse("submit-sweep"))
    page.click("#template-cpu-demo")
    page.wait_for_url("**template=cpu-demo")
    assert page.input_value("input[name=seeds]") == "0, 1"


def test_paper_claims_about_presets_the_sweep_never_ran_are_one_line_not_missing_cells(
    page, live_server, team, alice
):
    experiment = make_finished_experiment(team, alice)  # reinforce and grpo only
    page.goto(live_server.url + reverse("experiment-compare", args=[experiment.pk]))
    rendered(page, metric="eval/accuracy")
    verdicts = page.eval_on_selector_all("#findings > li", "items => items.map(li => li.dataset.verdict)")
    assert verdicts == ["contradict"], "no 'missing cells' entry for presets never run"
    line = page.text_content("#findings-left-out")
    assert line.startswith("Not checked, as the sweep ran none of their presets: “On-policy, reinforce,")
    assert "(needs rec-oneside-nois, rec-oneside-nois-wide)" in line and line.count("“") == 2
