"""The Content-Security-Policy in a real headless Chromium: the main pages (with their charts,
live refresh, form scripts, the API docs, the admin and the login page) come with it, work, and
report no violation of it; an inline script is refused and reported, so the check can fail."""

from __future__ import annotations

import pytest
from django.urls import reverse
from sample_experiments import make_finished_experiment
from support import queue_sweep

from experiments.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

# Each violation as the page's `securitypolicyviolation` event describes it.
REPORT_VIOLATIONS = """document.addEventListener("securitypolicyviolation", (e) =>
    window.reportViolation(`${e.violatedDirective} blocked ${e.blockedURI || "inline"} on ${e.documentURI}`));"""


@pytest.fixture
def violations(page) -> list[str]:
    found: list[str] = []
    page.expose_function("reportViolation", lambda text: found.append(text))
    page.add_init_script(REPORT_VIOLATIONS)
    page.on(
        "console",
        lambda message: "Content Security Policy" in message.text and found.append(message.text),
    )

    def check_header(response) -> None:
        if response.request.resource_type == "document":
            policy = response.headers.get("content-security-policy", "")
            if "script-src 'self';" not in policy:
                found.append(f"{response.url} came with the policy {policy!r}")

    page.on("response", check_header)
    return found


def settle(page) -> None:
    page.wait_for_load_state("networkidle")


def test_every_main_page_works_without_a_csp_violation(page, live_server, violations, team, alice):
    finished = make_finished_experiment(team, alice, seeds=(0,), steps=10)
    active = queue_sweep(team, alice, "active")
    url = live_server.url

    page.goto(url + reverse("experiment-list"))
    with page.expect_navigation():
        page.select_option("select[name=team]", str(team.pk))  # data-autosubmit (lab.js)
    assert f"team={team.pk}" in page.url

    page.goto(url + reverse("submit-sweep"))
    page.check("input[name=presets][value=grpo]")
    page.fill("input[name=seeds]", "0 1")  # submit.js counts the grid
    assert page.text_content("#grid-size").startswith("This sweep makes 2 runs × ")

    page.goto(url + reverse("experiment-detail", args=[active.pk]))  # lab.js polls the runs
    Run.objects.filter(experiment=active).update(status=Run.SUCCEEDED)
    page.wait_for_selector("#runs .status-succeeded")

    run = finished.runs.get(preset="grpo", staleness="on-policy")
    page.goto(url + reverse("run-detail", args=[run.pk]))  # Plotly
    page.wait_for_function("() => Number(document.getElementById('run-curves').dataset.rendered || 0) >= 1")
    assert page.locator("#run-curves .js-plotly-plot").count() > 0

    page.goto(url + reverse("experiment-compare", args=[finished.pk]))
    page.wait_for_function("() => document.getElementById('compare').dataset.rendered")
    page.press("input[name=k]", "Enter")  # data-no-submit: the controls never reload the page
    assert page.url.startswith(url + reverse("experiment-compare", args=[finished.pk]))

    page.goto(url + reverse("run-list"))
    page.check("#select-all")  # runs.js
    assert page.locator("#pick input[name=runs]:checked").count() == finished.runs.count() + 1

    for name, args in [("team-list", []), ("team-detail", [team.pk]), ("api-tokens", [])]:
        page.goto(url + reverse(name, args=args))
        settle(page)

    page.goto(url + "/api/docs")
    page.locator(".opblock").first.wait_for(state="visible")
    settle(page)

    alice.is_staff = alice.is_superuser = True
    alice.save()
    for path in ["/admin/", "/admin/experiments/run/", f"/admin/experiments/run/{run.pk}/change/"]:
        page.goto(url + path)
        settle(page)

    page.goto(url + reverse("experiment-list"))
    page.click("nav button:text('Log out')")
    page.wait_for_url(url + reverse("login"))
    settle(page)
    assert violations == []


def test_an_inline_script_is_refused_and_reported(page, live_server, violations):
    page.goto(live_server.url + reverse("experiment-list"))
    page.evaluate(
        """() => { const s = document.createElement("script"); s.textContent = "window.ran = true";
                   document.body.append(s); }"""
    )
    for _ in range(100):  # the report arrives asynchronously; 10 s at most
        if violations:
            break
        page.wait_for_timeout(100)
    assert page.evaluate("window.ran") is None
    assert any("script-src" in v for v in violations), violations
