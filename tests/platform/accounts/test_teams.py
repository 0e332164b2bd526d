"""Teams by consent: only a team's admins invite, a user joins only by accepting, the answer to
an invitation never tells whether an account exists, superusers are never invited, and anyone
can create a team of which they are the admin."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from accounts.models import Invitation, Membership

pytestmark = pytest.mark.django_db


@pytest.fixture
def users(django_user_model):
    made = {
        name: django_user_model.objects.create_user(name, password=f"{name}-password-1")
        for name in ("bob", "carol", "dave")
    }
    made["root"] = django_user_model.objects.create_superuser("root", password="root-password-1")
    made["gone"] = django_user_model.objects.create_user("gone", password="gone-password-1", is_active=False)
    return made


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def invite(client: Client, team, username: str, **extra) -> tuple[str, list[str]]:
    """Post the invitation form; where it redirected to and the messages the next page shows."""
    url = reverse("team-detail", args=[team.pk])
    response = client.post(url, {"username": username, **extra}, follow=True)
    return response.redirect_chain[-1][0], [str(m) for m in response.context["messages"]]


def test_an_invited_user_joins_only_by_accepting(alice_client, team, users):
    bob = users["bob"]
    assert invite(alice_client, team, "bob", is_admin="on")[0] == reverse("team-detail", args=[team.pk])
    assert not team.members.filter(pk=bob.pk).exists()

    teams_page = browser(bob).get(reverse("team-list")).content.decode()
    assert 'id="invitations"' in teams_page and team.name in teams_page and "alice" in teams_page
    invitation = bob.team_invitations.get()
    response = browser(bob).post(reverse("invitation-accept", args=[invitation.pk]))
    assert response["Location"] == reverse("team-detail", args=[team.pk])
    assert Membership.objects.get(team=team, user=bob).is_admin
    assert not Invitation.objects.exists()


def test_a_declined_invitation_leaves_no_membership(alice_client, team, users):
    carol = users["carol"]
    invite(alice_client, team, "carol")
    invitation = carol.team_invitations.get()
    assert browser(carol).post(reverse("invitation-decline", args=[invitation.pk])).status_code == 302
    assert not team.members.filter(pk=carol.pk).exists() and not Invitation.objects.exists()


def test_the_answer_is_the_same_whether_or_not_an_account_exists(alice_client, team, users):
    answers = {name: invite(alice_client, team, name) for name in ("bob", "nobody", "root", "gone", "alice")}
    neutral = {
        name: (location, [m.replace(repr(name), "NAME") for m in messages])
        for name, (location, messages) in answers.items()
    }
    assert len({repr(answer) for answer in neutral.values()}) == 1, answers
    location, messages = answers["nobody"]
    assert location == reverse("team-detail", args=[team.pk]) and messages == [
        "If 'nobody' is an account that can join team-a, it now has an invitation; "
        "it becomes a member when its owner accepts it under Teams."
    ]
    # Only bob, an active account outside the team that is no superuser, was invited.
    assert list(Invitation.objects.values_list("user__username", flat=True)) == ["bob"]
    assert team.members.count() == 1


def test_superusers_are_never_invited_nor_added(alice_client, team, users):
    root = users["root"]
    invite(alice_client, team, "root", is_admin="on")
    assert not root.team_invitations.exists() and not team.members.filter(pk=root.pk).exists()
    assert 'id="invitations"' not in browser(root).get(reverse("team-list")).content.decode()


def test_members_who_are_not_admins_cannot_invite_anyone(alice_client, team, users):
    bob, carol = users["bob"], users["carol"]
    Membership.objects.create(team=team, user=bob)
    for username in ("carol", "nobody"):
        assert invite(browser(bob), team, username)[1] == [
            "Only team admins can invite members; ask one of them."
        ]
    assert not Invitation.objects.exists() and not team.members.filter(pk=carol.pk).exists()
    page = browser(bob).get(reverse("team-detail", args=[team.pk])).content.decode()
    assert 'id="invite"' not in page


def test_outsiders_cannot_invite_and_only_the_invitee_answers_an_invitation(alice_client, team, users):
    dave = users["dave"]
    assert browser(dave).post(reverse("team-detail", args=[team.pk]), {"username": "dave"}).status_code == 404
    assert not Invitation.objects.exists()

    invite(alice_client, team, "bob")
    invitation = Invitation.objects.get()
    for name in ("accept", "decline"):
        assert browser(dave).post(reverse(f"invitation-{name}", args=[invitation.pk])).status_code == 404
        assert alice_client.post(reverse(f"invitation-{name}", args=[invitation.pk])).status_code == 404
    assert browser(users["bob"]).get(reverse("invitation-accept", args=[invitation.pk])).status_code == 405
    assert Invitation.objects.get() == invitation and not team.members.filter(username="bob").exists()


def test_any_user_can_create_a_team_and_is_its_admin(users):
    dave = users["dave"]
    response = browser(dave).post(reverse("team-list"), {"name": "dave's team"})
    team = dave.teams.get()
    assert response["Location"] == reverse("team-detail", args=[team.pk])
    assert team.name == "dave's team" and team.is_admin(dave) and team.members.count() == 1


def test_the_admin_never_puts_a_superuser_into_a_team_but_their_own_doing(users, django_user_model):
    """Staff editing a team in the admin cannot add a superuser (teams by consent); a superuser may
    add themselves, and other users are added as before."""
    from accounts.models import Team

    staff = django_user_model.objects.create_superuser("ops", password="ops-password-1")
    team = Team.objects.create(name="lab-ops")
    url = reverse("admin:accounts_team_change", args=[team.pk])

    def add(client: Client, user):
        return client.post(
            url,
            {
                "name": team.name,
                "memberships-TOTAL_FORMS": "1",
                "memberships-INITIAL_FORMS": "0",
                "memberships-MIN_NUM_FORMS": "0",
                "memberships-MAX_NUM_FORMS": "1000",
                "memberships-0-user": str(user.pk),
                "memberships-0-team": str(team.pk),
            },
        )

    refused = add(browser(staff), users["root"])
    assert refused.status_code == 200  # the form again, with the error
    assert "a superuser is never added to a team by someone else" in refused.content.decode()
    assert not Membership.objects.filter(team=team).exists()

    assert add(browser(staff), users["bob"]).status_code == 302
    assert add(browser(users["root"]), users["root"]).status_code == 302
    assert set(Membership.objects.filter(team=team).values_list("user__username", flat=True)) == {
        "bob",
        "root",
    }


def test_admins_see_pending_invitations_and_revoke_them(alice_client, team, users):
    invite(alice_client, team, "bob")
    invite(alice_client, team, "carl")  # a typo: no such account, so nothing waits
    page = alice_client.get(reverse("team-detail", args=[team.pk])).content.decode()
    invitation = users["bob"].team_invitations.get()
    assert f'<tr data-invitation="{invitation.pk}"><td>bob</td><td>member</td>' in page
    assert "carl" not in page
    revoke = reverse("invitation-revoke", args=[team.pk, invitation.pk])
    members = Membership.objects.create(team=team, user=users["carol"])
    assert browser(users["carol"]).post(revoke).status_code == 302 and Invitation.objects.exists(), (
        "admins only"
    )
    assert (
        "pending-invitations"
        not in browser(users["carol"]).get(reverse("team-detail", args=[team.pk])).content.decode()
    )
    members.delete()
    response = alice_client.post(revoke, follow=True)
    assert "Revoked the invitation of bob" in response.content.decode() and not Invitation.objects.exists()
    assert "None: every invitation was accepted, declined or revoked." in response.content.decode()


def test_the_only_admin_is_not_offered_remove_beside_themself(alice_client, team, users):
    page = alice_client.get(reverse("team-detail", args=[team.pk])).content.decode()
    assert page.count(">Remove</button>") == 0 and "the only admin" in page
    Membership.objects.create(team=team, user=users["bob"], is_admin=False)
    page = alice_client.get(reverse("team-detail", args=[team.pk])).content.decode()
    assert page.count(">Remove</button>") == 1, "bob, a member, may be removed; alice may not"
    Membership.objects.filter(team=team, user=users["bob"]).update(is_admin=True)
    page = alice_client.get(reverse("team-detail", args=[team.pk])).content.decode()
    assert page.count(">Remove</button>") == 2 and "the only admin" not in page
