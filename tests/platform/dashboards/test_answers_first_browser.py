"""The comparison page leads with the answer (in a real Chromium, at 1,280 and 1,920 px): one card
per question it answers at the top (the drop table with its verdict words; each claim's verdict with
the seeds that would settle it and Add seeds; the speed-up where the sweep has async cells), then
the charts, then the detail tables; every method paragraph behind "How this is computed"; no empty
chart. Screenshots land in var/test/screenshots/compare-answers-<width>.png."""

from __future__ import annotations

import json

import pytest
from dashboard_helpers import rendered
from django.urls import reverse
from support import TEST_VAR

from accounts.models import ApiToken

pytestmark = pytest.mark.django_db(transaction=True)

SCREENSHOTS = TEST_VAR / "screenshots"

# Where each part of the page sits (page coordinates), and what a person reads outside a disclosure.
LAYOUT_JS = """() => {
    const box = el => { if (!el || el.hidden || !el.getClientRects().length) return null;
                        const r = el.getBoundingClientRect();
                        return {t: r.top + window.scrollY, b: r.bottom + window.scrollY, l: r.left, r: r.right}; };
    const charts = [...document.querySelectorAll('#compare .js-plotly-plot')].filter(c => box(c));
    // method prose: a plain paragraph (notes and warnings carry a class: they are findings)
    const prose = [...document.querySelectorAll('#compare p:not([class])')]
        .filter(p => !p.closest('details') && box(p) && p.textContent.trim().length > 200)
        .map(p => p.textContent.trim().slice(0, 80));
    return {
        answers: box(document.getElementById('answers')),
        cards: [...document.querySelectorAll('#answers > .card')].filter(c => box(c)).map(c => c.id),
        firstChart: Math.min(...charts.map(c => box(c).t)),
        firstDetail: box(document.getElementById('summary')),
        empty: charts.filter(c => !(c.data || []).some(t => (t.y || []).some(v => v !== null && v !== undefined)))
                     .map(c => c.id || c.dataset.staleness || '?'),
        prose,
        width: document.documentElement.scrollWidth,
    };
}"""


@pytest.mark.parametrize("width", [1280, 1920])
def test_the_comparison_leads_with_its_answer(page, live_server, client, alice, demo, width):
    body = {
        "experiment": demo.pk,
        "parts": [{"kind": "beats", "x": "grpo", "y": "rec-oneside-nois"}],
        "settings": ["offline"],
        "title": "grpo ahead offline",
    }
    response = client.post(
        "/api/claims",
        json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {ApiToken.issue(alice)}",
    )
    assert response.status_code == 201, response.content
    (part,) = response.json()["by_setting"][0]["parts"]
    page.set_viewport_size({"width": width, "height": 1000})
    page.goto(live_server.url + reverse("experiment-compare", args=[demo.pk]) + "?metric=eval/accuracy")
    rendered(page, metric="eval/accuracy")
    page.wait_for_selector("#claims li[data-claim]")
    page.screenshot(path=str(SCREENSHOTS / f"compare-answers-{width}.png"), full_page=True)
    page.screenshot(path=str(SCREENSHOTS / f"compare-answers-{width}-top.png"))
    page.wait_for_selector("#answer-claims li[data-claim]")
    layout = page.evaluate(LAYOUT_JS)

    # The answers first, in the first screenful; the charts after them; the detail tables after those.
    assert layout["answers"] is not None and layout["answers"]["t"] < 600, layout
    assert layout["cards"] == ["answer-drops", "answer-claims"], layout  # no async cell: no speed-up card
    assert layout["answers"]["b"] <= layout["firstChart"] <= layout["firstDetail"]["t"], layout
    assert layout["width"] <= width, layout
    # The drop table's verdict columns (tolerance, rank) in view, not scrolled off in its box.
    verdicts = page.evaluate(
        "() => { const t = document.getElementById('drops'), box = t.parentElement.getBoundingClientRect();"
        " return [...t.rows[0].cells].slice(-2).map(c => c.getBoundingClientRect().right <= box.right + 1); }"
    )
    assert verdicts == [True, True], "tolerance and rank must show without scrolling the table"
    assert layout["prose"] == [], "method paragraphs belong behind 'How this is computed'"
    assert layout["empty"] == [], "no empty chart"

    # The drop table's verdict words, one row per line.
    drops = page.locator("#answer-drops #drops tr")
    assert drops.count() == 1 + 4
    header = drops.nth(0).text_content()
    assert "tolerance" in header and "rank" in header
    grpo = page.locator("#answer-drops #drops tr[data-line=grpo]").text_content()
    tolerance = page.locator("#answer-drops #drops tr[data-line=grpo] td").nth(-2).text_content()
    assert tolerance == "sync_offset=2", grpo  # not offline
    assert page.text_content("#drops caption").startswith(
        "Every change and verdict below rests on 3 seed pairs"
    )

    # Each claim: its verdict, the seeds that would settle it, the button to add them.
    claim = page.locator("#answer-claims li[data-claim]").text_content()
    assert claim.startswith("cannot tell yet") and "grpo ahead offline" in claim, claim
    assert f"about {part['seeds_needed']} seeds per cell would settle it" in claim, claim
    more = part["seeds_needed"] - 3
    add = page.locator("#answer-claims .add-seeds")
    assert add.get_attribute("href") == f"/experiments/{demo.pk}/seeds/?n={more}"

    # The claim's seeds figure and the "cannot be told apart" one for the same pair, and why they differ.
    tie = page.text_content("#ties")
    assert "rec-oneside-nois − grpo at offline" in tie and "seeds per preset would tell it from 0" in tie, tie
    detail = page.text_content(f"#claims li[data-claim='{response.json()['id']}']")
    assert 'D told from +0.02, one-sided); "Cannot be told apart" says about 32 for the same pair' in detail
    assert "that figure tells D from 0, this one from +0.02" in detail, detail
