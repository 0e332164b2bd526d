"""Deleting a report asks first, on a page of its own (as deleting an experiment does): the site's
CSP blocks inline handlers, so the `onsubmit="return confirm(…)"` it had never ran and one click
deleted the report and every version. Checked with the Django client and in a real Chromium."""

from __future__ import annotations

import pytest
from django.urls import reverse
from support import new_team_member

from dashboards.models import Report, ReportVersion
from dashboards.reports import service


def _published_twice(demo, alice) -> Report:
    link = f"/experiments/{demo.pk}/compare/?metric=eval/accuracy"
    report = Report.objects.create(
        team=demo.team, author=alice, title="Kept twice", source=f"{{{{ chart {link} }}}}"
    )
    service.publish(report, alice)
    service.publish(report, alice)
    return report


@pytest.mark.django_db
def test_deleting_a_report_asks_first_and_says_what_goes(alice_client, alice, demo):
    report = _published_twice(demo, alice)
    page = alice_client.get(f"/reports/{report.pk}/").content.decode()
    assert f'href="/reports/{report.pk}/delete"' in page and "onsubmit" not in page
    confirm = alice_client.get(f"/reports/{report.pk}/delete")
    assert confirm.status_code == 200
    text = confirm.content.decode()
    assert "2 published versions" in text and "36 runs its versions cite are no longer held" in text
    assert Report.objects.filter(pk=report.pk).exists(), "asking deletes nothing"
    assert alice_client.post(f"/reports/{report.pk}/delete").status_code == 302
    assert not Report.objects.filter(pk=report.pk).exists()
    assert not ReportVersion.objects.filter(report_id=report.pk).exists()


@pytest.mark.django_db
def test_a_member_who_may_not_delete_is_not_even_asked(client, alice, demo):
    report = _published_twice(demo, alice)
    from accounts.models import Membership

    carol = new_team_member("carol", "team-c")
    Membership.objects.create(team=demo.team, user=carol, is_admin=False)
    client.force_login(carol)
    assert client.get(f"/reports/{report.pk}/delete").status_code == 403
    assert 'id="report-delete"' not in client.get(f"/reports/{report.pk}/").content.decode()


@pytest.mark.django_db(transaction=True)
def test_in_chromium_one_click_only_asks_and_the_second_deletes(page, live_server, alice, demo):
    report = _published_twice(demo, alice)
    page.goto(live_server.url + reverse("report-detail", args=[report.pk]))
    page.click("#report-delete")
    page.wait_for_selector("#confirm-delete")
    assert Report.objects.filter(pk=report.pk).exists(), "the first click only asks"
    assert "2 published versions" in page.text_content("#deletes")
    page.click("#confirm-delete")
    page.wait_for_url(live_server.url + reverse("report-list"))
    assert not Report.objects.filter(pk=report.pk).exists()


@pytest.mark.django_db
def test_a_script_with_a_token_downloads_the_exports_the_page_offers(
    client, alice_client, alice, demo, token
):
    """`GET /api/reports/{id}/export.html` and `/export-csv.zip` with a token: the page's very files,
    for scripts that publish reports elsewhere; 409 before publishing, 404 for another team."""
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    report = _published_twice(demo, alice)
    for name in ("export.html", "export-csv.zip"):
        api = client.get(f"/api/reports/{report.pk}/{name}", **auth)
        page = alice_client.get(f"/reports/{report.pk}/{name}")
        assert api.status_code == page.status_code == 200
        assert api.content == page.content and api["Content-Type"] == page["Content-Type"]
        assert api["Content-Disposition"].endswith(f'report-{report.pk}-v2{name[6:]}"')
        first = client.get(f"/api/reports/{report.pk}/{name}", {"version": 1}, **auth)
        assert first["Content-Disposition"].endswith(f'report-{report.pk}-v1{name[6:]}"')
        assert client.get(f"/api/reports/{report.pk}/{name}", {"version": 3}, **auth).status_code == 404
        assert client.get(f"/api/reports/{report.pk}/{name}").status_code == 401
    draft = Report.objects.create(team=demo.team, author=alice, title="Draft", source="")
    refused = client.get(f"/api/reports/{draft.pk}/export.html", **auth)
    assert refused.status_code == 409 and "Publish the report first" in refused.json()["detail"]
    bob = new_team_member("bob", "team-b")
    client.force_login(bob)
    from accounts.models import ApiToken

    bobs = {"HTTP_AUTHORIZATION": f"Bearer {ApiToken.issue(bob)}"}
    assert client.get(f"/api/reports/{report.pk}/export.html", **bobs).status_code == 404
