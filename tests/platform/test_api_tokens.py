"""The API tokens page: a new token is shown once, listed by its digest's start, and revoking
it makes the API refuse it."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse
from experiments.models import ApiToken

pytestmark = pytest.mark.django_db


def test_a_token_is_shown_once_works_and_stops_working_when_revoked(alice_client, alice):
    url = reverse("api-tokens")
    assert url in alice_client.get(reverse("experiment-list")).content.decode(), "linked from the top bar"
    assert "No tokens yet." in alice_client.get(url).content.decode()

    created = alice_client.post(url).content.decode()
    token = re.search(r'<pre id="new-token">([^<]+)</pre>', created).group(1)
    stored = alice.api_tokens.get()
    assert ApiToken.user_for(token) == alice and stored.digest != token
    assert f"<code>{stored.digest[:8]}…</code>" in created

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
    assert browser.post(reverse("api-tokens")).status_code == 403
    assert alice.api_tokens.count() == 0
