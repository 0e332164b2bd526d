"""Who sees what: teams isolate experiments, anonymous users log in first, POSTs need CSRF,
and only team admins change a team's members."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse
from support import new_team_member

from accounts.models import ApiToken, Membership, Team
from experiments.models import Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(make_run):
    return make_run("team A's")


@pytest.fixture
def bob(django_user_model):
    bob = new_team_member("bob", "team-b")
    return bob


def pages(run) -> list[tuple[str, str]]:
    e = run.experiment_id
    return [
        ("get", reverse("experiment-detail", args=[e])),
        ("get", reverse("experiment-runs-live", args=[e])),
        ("post", reverse("experiment-cancel", args=[e])),
        ("post", reverse("experiment-archive", args=[e])),
        ("post", reverse("experiment-unarchive", args=[e])),
        ("get", reverse("experiment-delete", args=[e])),
        ("post", reverse("experiment-delete", args=[e])),
        ("get", reverse("run-detail", args=[run.pk])),
        ("get", reverse("run-live", args=[run.pk])),
        ("post", reverse("run-cancel", args=[run.pk])),
        ("post", reverse("run-retry", args=[run.pk])),
        ("get", reverse("team-detail", args=[run.experiment.team_id])),
    ]


def api_calls(run) -> list[tuple[str, str]]:
    return [
        ("get", f"/api/experiments/{run.experiment_id}/runs"),
        ("post", f"/api/experiments/{run.experiment_id}/cancel"),
        ("post", f"/api/experiments/{run.experiment_id}/archive"),
        ("post", f"/api/experiments/{run.experiment_id}/unarchive"),
        ("delete", f"/api/experiments/{run.experiment_id}"),
        ("get", f"/api/runs/{run.pk}"),
        ("get", f"/api/runs/{run.pk}/metrics?format=csv"),
        ("post", f"/api/runs/{run.pk}/cancel"),
        ("post", f"/api/runs/{run.pk}/retry"),
    ]


def test_other_teams_objects_are_404_on_pages_and_in_the_api(client, run, bob):
    client.force_login(bob)
    for method, url in pages(run):
        assert getattr(client, method)(url).status_code == 404, url
    assert run.experiment.name not in client.get(reverse("experiment-list")).content.decode()

    token = ApiToken.issue(bob)
    for method, url in api_calls(run):
        assert getattr(client, method)(url, HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 404, url
    assert client.get("/api/experiments", HTTP_AUTHORIZATION=f"Bearer {token}").json()["items"] == []
    run.refresh_from_db()
    assert run.status == Run.QUEUED and run.attempt == 1 and run.experiment.archived is None


def test_anonymous_users_are_sent_to_login_and_the_api_wants_a_token(client, run):
    for method, url in pages(run) + [("get", reverse("experiment-list")), ("get", reverse("submit-sweep"))]:
        response = getattr(client, method)(url)
        assert response.status_code == 302 and response["Location"].startswith(reverse("login")), url
    for method, url in api_calls(run):
        assert getattr(client, method)(url).status_code == 401, url
        assert getattr(client, method)(url, HTTP_AUTHORIZATION="Bearer not-a-token").status_code == 401, url


def test_posts_without_csrf_are_refused(alice, run):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)
    assert browser.post(reverse("run-cancel", args=[run.pk])).status_code == 403
    assert browser.post(reverse("experiment-cancel", args=[run.experiment_id])).status_code == 403
    assert browser.post(reverse("experiment-delete", args=[run.experiment_id])).status_code == 403
    assert browser.post(reverse("submit-sweep"), {"name": "x"}).status_code == 403
    assert browser.post(reverse("team-list"), {"name": "x"}).status_code == 403
    run.refresh_from_db()
    assert run.status == Run.QUEUED and Team.objects.filter(name="x").count() == 0


def test_a_member_sees_the_run_page_with_completions_escaped(alice_client, run):
    run.completions.create(step=1, prompt="<script>alert(1)</script>", completion="<b>42</b>", reward=1.0)
    html = alice_client.get(reverse("run-detail", args=[run.pk])).content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "&lt;b&gt;42&lt;/b&gt;" in html
    assert "<script>alert(1)" not in html


def test_cancel_and_retry_buttons_move_a_queued_run(alice_client, run):
    alice_client.post(reverse("run-cancel", args=[run.pk]))
    run.refresh_from_db()
    assert run.status == Run.CANCELLED
    alice_client.post(reverse("run-retry", args=[run.pk]))
    run.refresh_from_db()
    assert (run.status, run.attempt) == (Run.QUEUED, 2)
    response = alice_client.post(reverse("run-retry", args=[run.pk]), follow=True)
    assert "only failed, cancelled or lost runs can be retried" in response.content.decode()


def test_team_admins_invite_and_remove_members_and_members_cannot(alice_client, team, bob):
    url = reverse("team-detail", args=[team.pk])
    assert alice_client.post(url, {"username": "bob"}).status_code == 302
    assert not team.members.filter(username="bob").exists(), "bob joins only when he accepts"

    bob_browser = Client()
    bob_browser.force_login(bob)
    invitation = bob.team_invitations.get(team=team)
    bob_browser.post(reverse("invitation-accept", args=[invitation.pk]))
    assert team.members.filter(username="bob").exists()
    alice_membership = team.memberships.get(user__username="alice")
    bob_browser.post(reverse("team-remove-member", args=[team.pk, alice_membership.pk]))
    assert team.members.filter(username="alice").exists(), "a plain member cannot remove anyone"

    bob_membership = team.memberships.get(user=bob)
    alice_client.post(reverse("team-remove-member", args=[team.pk, bob_membership.pk]))
    assert not team.members.filter(username="bob").exists()


def test_creating_a_team_makes_its_creator_admin(alice_client, alice):
    response = alice_client.post(reverse("team-list"), {"name": "new team"})
    team = Team.objects.get(name="new team")
    assert response["Location"] == reverse("team-detail", args=[team.pk])
    assert team.is_admin(alice)


def test_logout_is_a_post_and_ends_the_session(alice_client):
    assert alice_client.post(reverse("logout"))["Location"] == reverse("login")
    assert alice_client.get(reverse("experiment-list"))["Location"].startswith(reverse("login"))


def test_old_admin_addresses_of_moved_models_redirect(admin_client, run):
    """Teams and tokens moved from the experiments app to accounts: bookmarks still work."""
    team = run.experiment.team
    response = admin_client.get(f"/admin/experiments/team/{team.pk}/change/?x=1")
    assert (response.status_code, response["Location"]) == (
        301,
        f"/admin/accounts/team/{team.pk}/change/?x=1",
    )
    assert admin_client.get("/admin/experiments/apitoken/")["Location"] == "/admin/accounts/apitoken/"
    assert admin_client.get("/admin/experiments/run/").status_code == 200  # runs did not move


def test_the_admin_manages_teams_members_and_runs(admin_client, run):
    for url in [
        "/admin/accounts/team/",
        "/admin/accounts/team/add/",
        "/admin/experiments/experiment/",
        f"/admin/experiments/experiment/{run.experiment_id}/change/",
        "/admin/experiments/run/",
        f"/admin/experiments/run/{run.pk}/change/",
        "/admin/accounts/apitoken/",
        "/admin/accounts/invitation/",
    ]:
        assert admin_client.get(url).status_code == 200, url
    team = run.experiment.team
    response = admin_client.post(
        f"/admin/accounts/team/{team.pk}/change/",
        {
            "name": team.name,
            "memberships-TOTAL_FORMS": "2",
            "memberships-INITIAL_FORMS": "1",
            "memberships-0-id": team.memberships.get().pk,
            "memberships-0-team": team.pk,
            "memberships-0-user": team.memberships.get().user_id,
            "memberships-0-is_admin": "on",
            "memberships-1-team": team.pk,
            "memberships-1-user": admin_client.session["_auth_user_id"],
        },
    )
    assert response.status_code == 302, response.context["errors"] if response.context else response
    assert team.members.count() == 2


def test_a_member_sees_only_the_actions_their_role_allows(alice_client, run, django_user_model):
    carol = django_user_model.objects.create_user("carol")
    Membership.objects.create(team=run.experiment.team, user=carol)
    member = Client()
    member.force_login(carol)
    url = reverse("experiment-detail", args=[run.experiment_id])
    assert 'id="delete-link"' in alice_client.get(url).content.decode()
    assert 'id="delete-link"' not in member.get(url).content.decode()
    assert 'id="archive"' in member.get(url).content.decode(), "members may archive"


def test_a_non_member_gets_the_sites_own_404_page(client, run, bob):
    client.force_login(bob)
    response = client.get(reverse("experiment-detail", args=[run.experiment_id]))
    html = response.content.decode()
    assert response.status_code == 404 and "<nav>" in html and "Not found" in html
    assert "team A's" not in html
    missing = client.get(reverse("experiment-detail", args=[10**9])).content.decode()
    token = re.compile(r'name="csrfmiddlewaretoken" value="[^"]+"')
    assert token.sub("", html) == token.sub("", missing), "the same page as for one that does not exist"
