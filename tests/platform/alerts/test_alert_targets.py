"""The alerts section of the team page: admins add targets (a webhook URL checked when saved:
http(s) only, no loopback or private address unless allowed), remove them and send a test that a
worker's delivery pass sends; members see none of it and change nothing; every change is a POST
with its CSRF token."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse
from support import new_team_member

from alerts.deliver import deliver_due
from alerts.models import RUN_FAILED, SWEEP_FINISHED, TEST, Delivery, Event, Target

pytestmark = pytest.mark.django_db


def add(client: Client, team, **fields):
    body = {"kind": "webhook", "url": "", "email": "", "events": [RUN_FAILED], **fields}
    return client.post(reverse("alert-target-add", args=[team.pk]), body)


def url_errors(response) -> list[str]:
    return response.context["alert_form"].errors.get("url", [])


@pytest.mark.parametrize(
    "url, words",
    [
        ("http://127.0.0.1:8080/hook", "127.0.0.1, a loopback, private or link-local address"),
        ("http://localhost/hook", "a loopback, private or link-local address"),
        ("http://10.1.2.3/hook", "10.1.2.3"),
        ("http://192.168.0.10/hook", "192.168.0.10"),
        ("http://169.254.169.254/latest/meta-data", "169.254.169.254"),
        ("http://[::1]/hook", "::1"),
        ("http://[::ffff:127.0.0.1]/hook", "::ffff:127.0.0.1"),
    ],
)
def test_a_webhook_to_a_private_address_is_refused_naming_the_field(alice_client, team, url, words):
    response = add(alice_client, team, url=url)
    assert response.status_code == 400
    (error,) = url_errors(response)
    assert words in error and "LAB_ALERTS_ALLOW_PRIVATE=1" in error
    assert not Target.objects.exists()


@pytest.mark.parametrize(
    "fields, field, words",
    [
        ({"url": "ftp://example.org/hook"}, "url", "must start with http:// or https://"),
        ({"url": "file:///etc/passwd"}, "url", "Enter a valid URL"),
        ({"url": ""}, "url", "needs the webhook's URL"),
        ({"kind": "email", "email": ""}, "email", "needs an email address"),
        ({"kind": "email", "email": "not an address"}, "email", "valid email"),
        ({"events": ["run.exploded"]}, "events", "not one of the available choices"),
        ({"kind": "pager", "url": "https://example.org"}, "kind", "not one of the available choices"),
    ],
)
def test_a_bad_target_is_refused_naming_the_field(alice_client, team, fields, field, words):
    response = add(alice_client, team, **fields)
    assert response.status_code == 400
    errors = response.context["alert_form"].errors
    assert any(words in e for e in errors.get(field, [])), errors
    assert not Target.objects.exists()


def test_an_admin_adds_a_target_sends_a_test_and_reads_the_log(alice_client, team, settings):
    settings.LAB_ALERTS_ALLOW_PRIVATE = True
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    response = add(alice_client, team, url="http://127.0.0.1:9/hook", events=[RUN_FAILED, SWEEP_FINISHED])
    assert response.status_code == 302 and response["Location"].endswith("#alerts")
    hook = Target.objects.get()
    assert (hook.kind, hook.url, hook.events) == (
        "webhook",
        "http://127.0.0.1:9/hook",
        [RUN_FAILED, SWEEP_FINISHED],
    )
    add(alice_client, team, kind="email", email="oncall@example.org")
    email = Target.objects.get(kind="email")
    page = alice_client.get(reverse("team-detail", args=[team.pk])).content.decode()
    assert "http://127.0.0.1:9/hook" in page and "oncall@example.org" in page and hook.secret in page
    alice_client.post(reverse("alert-target-test", args=[team.pk, email.pk]))
    event = Event.objects.get()
    assert event.kind == TEST and [d.target for d in event.deliveries.all()] == [email], "to that target only"
    deliver_due()
    page = alice_client.get(reverse("team-detail", args=[team.pk])).content.decode()
    log = page[page.index('id="alert-log"') :]
    assert "test" in log and "oncall@example.org" in log and "delivered" in log
    alice_client.post(reverse("alert-target-remove", args=[team.pk, hook.pk]))
    assert list(Target.objects.all()) == [email]


def test_members_who_are_not_admins_see_and_change_nothing(team, settings):
    settings.LAB_ALERTS_ALLOW_PRIVATE = True
    hook = Target.objects.create(
        team=team, kind="webhook", url="https://hooks.example.org/x", events=[RUN_FAILED]
    )
    member = new_team_member("bob", "team-b")
    team.memberships.create(user=member, is_admin=False)
    client = Client()
    client.force_login(member)
    page = client.get(reverse("team-detail", args=[team.pk])).content.decode()
    assert "hooks.example.org" not in page and hook.secret not in page and 'id="alerts"' not in page
    add(client, team, url="http://127.0.0.1:9/x")
    client.post(reverse("alert-target-test", args=[team.pk, hook.pk]))
    client.post(reverse("alert-target-remove", args=[team.pk, hook.pk]))
    assert list(Target.objects.all()) == [hook] and not Event.objects.exists()
    outsider = new_team_member("carol", "team-c")
    client.force_login(outsider)
    assert client.post(reverse("alert-target-test", args=[team.pk, hook.pk])).status_code == 404


def test_changes_need_a_post_with_its_csrf_token(team, alice):
    hook = Target.objects.create(
        team=team, kind="webhook", url="https://hooks.example.org/x", events=[RUN_FAILED]
    )
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    assert client.get(reverse("alert-target-test", args=[team.pk, hook.pk])).status_code == 405
    assert client.post(reverse("alert-target-test", args=[team.pk, hook.pk])).status_code == 403
    assert client.post(reverse("alert-target-remove", args=[team.pk, hook.pk])).status_code == 403
    assert not Delivery.objects.exists() and Target.objects.filter(pk=hook.pk).exists()
