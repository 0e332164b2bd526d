"""The Runs page in a real headless Chromium: a query filters the list and a mistake is shown with a
caret under its position; tagging the runs ticked, then every run the filters match; a saved view
restores its query for a teammate. Screenshots land in var/test/screenshots/."""

from __future__ import annotations

import pytest
from django.urls import reverse
from sample_experiments import make_finished_experiment
from support import TEST_VAR

from accounts.models import Membership
from experiments.models import RunTag, SavedView

pytestmark = pytest.mark.django_db(transaction=True)


def shown(page) -> list[int]:
    return [
        int(v)
        for v in page.eval_on_selector_all("#pick input[name=runs]", "boxes => boxes.map(b => b.value)")
    ]


def test_query_tag_a_selection_and_a_saved_view(page, live_server, team, alice, django_user_model):
    experiment = make_finished_experiment(team, alice, seeds=(0, 1))  # reinforce, grpo × 2 settings × 2 seeds
    grpo = sorted(experiment.runs.filter(preset="grpo").values_list("pk", flat=True))
    page.goto(live_server.url + reverse("run-list"))
    page.fill("#run-query", "preset = grpo and (seed = 0 or seed = 1)")
    page.click("#filters button")
    page.wait_for_url("**q=preset*")
    assert sorted(shown(page)) == grpo

    page.fill("#run-query", "preset = grpo and seed >")
    page.click("#filters button")
    page.wait_for_selector("#query-error")
    error = page.text_content("#query-error").split("\n")
    assert error == [
        "preset = grpo and seed >",
        " " * 24 + "^",
        "at position 24: the query ends too early",
    ]
    assert "q at position 24: the query ends too early; not filtered by the query" in page.text_content(
        ".messages"
    )

    # Tick two runs and tag them.
    page.goto(live_server.url + reverse("run-list") + "?q=preset%20%3D%20grpo")
    page.check(f"#pick input[value='{grpo[0]}']")
    page.check(f"#pick input[value='{grpo[1]}']")
    page.fill("#tag-form input[name=add]", "keep, look-again")
    page.click("#tag-button")
    page.wait_for_selector(".messages li.success")
    assert "Tagged 2 runs: 4 tags added, 0 removed." in page.text_content(".messages")
    assert sorted(RunTag.objects.filter(name="keep").values_list("run_id", flat=True)) == grpo[:2]
    assert "keep" in page.text_content(f"#pick tr:has(input[value='{grpo[0]}']) td.tags")
    assert page.url.endswith("?q=preset+%3D+grpo"), "back on the same filters"

    # Every run the filters match: the 4 grpo runs.
    page.select_option("#tag-form select[name=which]", "matching")
    page.fill("#tag-form input[name=add]", "grpo-runs")
    page.click("#tag-button")
    page.wait_for_selector(".messages li.success")
    assert sorted(RunTag.objects.filter(name="grpo-runs").values_list("run_id", flat=True)) == grpo
    page.fill("#run-query", "tag = keep")
    page.click("#filters button")
    page.wait_for_url("**q=tag*")
    assert sorted(shown(page)) == grpo[:2]

    # Save the query as the team's view; a teammate opens it and gets the query back.
    page.fill("#save-view input[name=name]", "kept grpo runs")
    page.click("#save-view-button")
    page.wait_for_selector("#saved-views a")
    view = SavedView.objects.get()
    assert (view.name, view.query, view.team) == ("kept grpo runs", "tag = keep", team)
    page.screenshot(path=str(TEST_VAR / "screenshots" / "runs-query-tags.png"), full_page=True)
    bob = django_user_model.objects.create_user("bob", password="bob-password-1")
    Membership.objects.create(team=team, user=bob)
    page.context.clear_cookies()
    page.goto(live_server.url + reverse("login"))
    page.fill("input[name=username]", "bob")
    page.fill("input[name=password]", "bob-password-1")
    page.click("button[type=submit]")
    page.goto(live_server.url + reverse("run-list"))
    page.click("#saved-views a:text('kept grpo runs')")
    page.wait_for_url("**q=tag*")
    assert page.input_value("#run-query") == "tag = keep"
    assert sorted(shown(page)) == grpo[:2]
