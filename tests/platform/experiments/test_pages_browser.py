"""The pages' live parts in a real headless Chromium: the sweep form counts its grid as you
type, and the experiment page refreshes its runs by polling until none is active."""

from __future__ import annotations

import pytest
from django.urls import reverse
from support import TEST_VAR, queue_sweep

from experiments.models import Run
from rlcore.presets import PRESETS

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_form_counts_the_runs_of_the_grid_while_typing(page, live_server):
    page.goto(live_server.url + reverse("submit-sweep"))
    assert page.text_content("#grid-size") == "Tick at least one preset: this sweep makes no run yet."
    page.check("input[name=presets][value=grpo]")
    assert (
        page.text_content("#grid-size") == "This sweep makes 1 run × 150 steps (default), lr 3e-05 (default)."
    )
    page.check("input[name=presets][value=rec-oneside-nois]")
    page.fill("input[name=sync_offsets]", "8, 32")
    page.fill("input[name=seeds]", "0 1 2")
    assert (
        page.text_content("#grid-size")
        == "This sweep makes 18 runs × 150 steps (default), lr 3e-05 (default)."
    )
    page.fill("input[name=steps]", "60")
    assert page.text_content("#grid-size") == "This sweep makes 18 runs × 60 steps, lr 3e-05 (default)."
    page.fill("textarea[name=axes]", "optimizer.minibatches: 1, 4\nrollout.dtype: same, bfloat16, float16")
    assert page.text_content("#grid-size") == "This sweep makes 108 runs × 60 steps, lr 3e-05 (default)."
    page.screenshot(path=TEST_VAR / "screenshots" / "sweep-axes.png", full_page=True)
    page.fill("textarea[name=axes]", "")
    assert page.get_attribute("input[name='optimizer.lr']", "placeholder") == "default 3e-05"


def test_letters_in_a_number_field_are_named_and_never_submitted(page, live_server, team):
    page.goto(live_server.url + reverse("submit-sweep"))
    page.fill("input[name=name]", "typed badly")
    page.check("input[name=presets][value=grpo]")
    page.fill("input[name=steps]", "sixty")
    page.fill("input[name='optimizer.lr']", "fast")
    assert page.input_value("input[name=steps]") == "sixty", "the box keeps what was typed"
    problems = page.inner_text("#typing-problems")
    assert "Trainer steps: “sixty” is not a whole number" in problems
    assert "Learning rate: “fast” is not a number" in problems
    assert "steps" not in page.text_content("#grid-size"), "no value shown that is not the one typed"
    assert page.text_content("#grid-size").endswith("Fix the 2 fields marked in red first.")
    # Listed at the top of the form, each linked to its box, which is marked.
    first = page.evaluate("document.querySelector('#sweep-form > :not(input)').id")
    assert first == "typing-problems-top" and page.is_visible("#typing-problems-top")
    links = page.eval_on_selector_all("#typing-problems a", "a => a.map(x => x.getAttribute('href'))")
    assert links == ["#id_optimizer.lr", "#id_steps"] or links == ["#id_steps", "#id_optimizer.lr"]
    marked = page.eval_on_selector_all("input[aria-invalid=true]", "els => els.map(e => e.name)")
    assert sorted(marked) == ["optimizer.lr", "steps"]
    page.fill("input[name='optimizer.lr']", "3e-5")
    assert page.eval_on_selector_all("input[aria-invalid=true]", "els => els.map(e => e.name)") == ["steps"]
    page.fill("input[name='optimizer.lr']", "fast")
    page.click("button:text('Submit sweep')")
    page.wait_for_function("window.scrollY < document.getElementById('typing-problems-top').offsetTop + 50")
    page.screenshot(path=TEST_VAR / "screenshots" / "sweep-letters.png", full_page=True)
    assert page.url.endswith(reverse("submit-sweep")) and Run.objects.count() == 0
    # Without the page's script (or past it) the server refuses them too, naming each.
    page.evaluate("document.getElementById('sweep-form').submit()")
    page.wait_for_selector("#error-summary")
    summary = page.inner_text("#error-summary")
    assert "“sixty” is not a whole number; leave it blank for the default, 150" in summary
    assert "“fast” is not a number; leave it blank for the default, 3e-05" in summary
    assert Run.objects.count() == 0


def test_a_user_in_no_team_is_told_to_create_or_join_one_first(browser, live_server, django_user_model):
    django_user_model.objects.create_user("loner", password="loner-password-1")
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.goto(live_server.url + reverse("login"))
    page.fill("input[name=username]", "loner")
    page.fill("input[name=password]", "loner-password-1")
    page.click("button[type=submit]")
    page.goto(live_server.url + reverse("submit-sweep"))
    assert "You are in no team yet" in page.inner_text("#no-team")
    assert page.locator("#sweep-form").count() == 0
    context.close()


def test_the_experiment_page_polls_until_no_run_is_active(page, live_server, team, alice):
    experiment = queue_sweep(team, alice, "live")
    run = experiment.runs.get()
    page.goto(live_server.url + reverse("experiment-detail", args=[experiment.pk]))
    assert page.text_content(".status-queued") == "queued"
    Run.objects.filter(pk=run.pk).update(status=Run.SUCCEEDED, progress=6, summary={"eval/accuracy": 0.75})
    page.wait_for_selector(".status-succeeded")
    assert "0.75" in page.text_content("#runs")
    assert page.locator("#runs [data-active=false]").count() == 1


def test_the_form_explains_itself_and_links_each_error_to_its_field(page, live_server, team):
    page.goto(live_server.url + reverse("submit-sweep"))
    assert page.text_content("label[for='id_task.min_operand']") == "Smallest operand:"
    assert page.text_content("label[for='id_rollout.group_size']") == "Group size:"
    assert PRESETS["rec-oneside-nois-wide"].description in page.text_content("#id_presets")
    assert "the wider clip learns faster" in page.text_content("#id_presets")
    staleness = page.text_content("#staleness")
    assert "v(t) = k·max(0, ⌊(t − d − 1)/k⌋)" in staleness
    assert "step t trains on a batch from the policy d steps older than on-policy" in staleness

    arithmetic, jsonl = "[id='id_task.min_operand']", "[id='id_task.path']"
    assert page.is_visible(arithmetic) and page.is_hidden(jsonl)
    page.select_option("select[name='task.name']", "jsonl")
    assert page.is_hidden(arithmetic) and page.is_visible(jsonl)
    page.select_option("select[name='task.name']", "arithmetic")
    assert page.is_visible(arithmetic) and page.is_hidden(jsonl)

    page.fill("input[name=name]", "explained")
    page.check("input[name=presets][value=grpo]")
    page.fill("input[name='rollout.group_size']", "1")
    page.fill("input[name=sync_offsets]", "8, 8")
    page.click("button:text('Submit sweep')")
    page.wait_for_selector("#error-summary")
    first = page.evaluate("document.querySelector('#sweep-form > :not(input)').id")
    assert first == "error-summary"
    links = page.eval_on_selector_all("#error-summary a", "links => links.map(a => a.getAttribute('href'))")
    assert links == ["#id_sync_offsets", "#id_rollout.group_size"]
    for href in links:
        page.click(f"#error-summary a[href='{href}']")
        assert page.evaluate("location.hash") == href
        assert page.evaluate("document.querySelector(':target').id") == href[1:]
    assert Run.objects.count() == 0


def test_the_experiment_pages_runs_sort_by_a_clicked_column_and_stay_sorted_while_it_refreshes(
    page, live_server, team, alice
):
    from datetime import timedelta

    from django.utils import timezone

    experiment = queue_sweep(team, alice, "sorted", seeds=(0, 1, 2))
    first, second, third = experiment.runs.order_by("pk")
    now = timezone.now()
    Run.objects.filter(pk=first.pk).update(
        status=Run.SUCCEEDED, started=now - timedelta(seconds=50), finished=now
    )
    Run.objects.filter(pk=second.pk).update(
        status=Run.SUCCEEDED, started=now - timedelta(seconds=500), finished=now
    )
    page.goto(live_server.url + reverse("experiment-detail", args=[experiment.pk]))

    def order() -> list[str]:
        return page.eval_on_selector_all("#sweep-runs tr[data-run]", "rows => rows.map(r => r.dataset.run)")

    assert order() == [str(first.pk), str(second.pk), str(third.pk)]
    page.click("#sweep-runs th:text-is('Took')")
    assert order() == [str(first.pk), str(second.pk), str(third.pk)], "shortest first, not started last"
    page.click("#sweep-runs th:text-is('Took')")
    assert order() == [str(second.pk), str(first.pk), str(third.pk)]
    # The third still queued, the page refreshes; the order holds.
    Run.objects.filter(pk=third.pk).update(
        status=Run.SUCCEEDED, started=now - timedelta(seconds=900), finished=now
    )
    page.wait_for_function("() => document.querySelector('#runs [data-active=false]')")
    assert order() == [str(third.pk), str(second.pk), str(first.pk)]
    page.screenshot(path=TEST_VAR / "screenshots" / "experiment-sorted.png", full_page=True)


def test_the_blank_form_ticks_no_preset_and_counts_only_the_ones_ticked(page, live_server, team):
    """A preset ticked by default was added to every sweep of a user who did not see it (48 runs
    counted, not 36)."""
    page.goto(live_server.url + reverse("submit-sweep"))
    assert page.locator("input[name=presets]:checked").count() == 0
    page.fill("input[name=seeds]", "0, 1, 2")
    page.fill("input[name=sync_offsets]", "4, 16")
    page.wait_for_function(
        "document.querySelector('#grid-size').textContent.includes('Tick at least one preset')"
    )
    for preset in ("grpo", "m2po", "decoupled-ppo"):
        page.check(f"input[name=presets][value={preset}]")
    page.wait_for_function(
        "document.querySelector('#grid-size').textContent.startsWith('This sweep makes 27 runs')"
    )
    page.fill("input[name=name]", "nothing ticked")
    for preset in ("grpo", "m2po", "decoupled-ppo"):
        page.uncheck(f"input[name=presets][value={preset}]")
    page.click("button:text('Submit sweep')")
    page.wait_for_selector("#error-summary")
    assert "#id_presets" in page.eval_on_selector_all(
        "#error-summary a", "a => a.map(x => x.getAttribute('href'))"
    )
    assert Run.objects.count() == 0
