"""The API tokens page: a new token has a name and is shown once (a reload shows it no more and
makes no second one), is listed by its name and its digest's start, and revoking it makes the API
refuse it; a user has at most `LAB_MAX_TOKENS_PER_USER` tokens."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from accounts.models import ApiToken

pytestmark = pytest.mark.django_db


def test_a_token_is_shown_once_works_and_stops_working_when_revoked(alice_client, alice):
    url = reverse("api-tokens")
    assert url in alice_client.get(reverse("experiment-list")).content.decode(), "linked from the top bar"
    assert "No tokens yet." in alice_client.get(url).content.decode()

    posted = alice_client.post(url, {"name": "laptop"})
    assert posted.status_code == 302 and posted["Location"] == url, "post/redirect/get"
    created = alice_client.get(url).content.decode()
    token = re.search(r'<pre id="new-token">([^<]+)</pre>', created).group(1)
    stored = alice.api_tokens.get()
    assert ApiToken.user_for(token) == alice and stored.digest != token and stored.name == "laptop"
    assert f"<code>{stored.digest[:8]}…</code>" in created and "<td>laptop</td>" in created
    reloaded = alice_client.get(url).content.decode()
    assert token not in reloaded and alice.api_tokens.count() == 1, "a reload shows it no more, makes none"

    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    assert Client().get("/api/experiments", **auth).status_code == 200
    listing = alice_client.get(url).content.decode()
    assert token not in listing and "never" not in listing, "shown once; last use recorded"

    alice_client.post(reverse("api-token-revoke", args=[stored.pk]))
    assert alice.api_tokens.count() == 0
    assert Client().get("/api/experiments", **auth).status_code == 401


def test_nobody_revokes_another_users_token(client, alice, django_user_model):
    token = ApiToken.issue(alice)
    mallory = django_user_model.objects.create_user("mallory")
    client.force_login(mallory)
    assert client.post(reverse("api-token-revoke", args=[alice.api_tokens.get().pk])).status_code == 404
    assert ApiToken.user_for(token) == alice
    assert "No tokens yet." in client.get(reverse("api-tokens")).content.decode()


def test_token_posts_need_csrf(alice):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)
    assert browser.post(reverse("api-tokens"), {"name": "x"}).status_code == 403
    assert alice.api_tokens.count() == 0


def test_a_token_needs_a_name(alice_client, alice):
    refused = alice_client.post(reverse("api-tokens"), {"name": "  "})
    assert refused.status_code == 422 and "This field is required." in refused.content.decode()
    assert alice.api_tokens.count() == 0


def test_a_user_has_at_most_the_token_cap(alice_client, alice, settings):
    settings.LAB_MAX_TOKENS_PER_USER = 3
    for i in range(5):
        alice_client.post(reverse("api-tokens"), {"name": f"t{i}"})
    assert alice.api_tokens.count() == 3
    page = alice_client.get(reverse("api-tokens")).content.decode()
    assert "No token made: you have 3 API tokens, the most a user may have (LAB_MAX_TOKENS_PER_USER)" in page
