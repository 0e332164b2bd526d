"""Every response carries the Content-Security-Policy and the other protective headers: pages,
the login page, JSON, the API (also when it refuses), static files and the admin."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

pytestmark = pytest.mark.django_db

HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
}


def test_every_kind_of_response_carries_the_security_headers(alice_client, alice, team):
    anonymous = Client()
    responses = {
        "login": anonymous.get(reverse("login")),
        "health": anonymous.get(reverse("health")),
        "api without a token": anonymous.get("/api/experiments"),
        "static file": anonymous.get("/static/experiments/lab.js"),
        "redirect to login": anonymous.get(reverse("experiment-list")),
        "experiments": alice_client.get(reverse("experiment-list")),
        "new sweep": alice_client.get(reverse("submit-sweep")),
        "team": alice_client.get(reverse("team-detail", args=[team.pk])),
        "not found": alice_client.get("/no-such-page/"),
    }
    alice.is_staff = alice.is_superuser = True
    alice.save()
    responses["admin"] = alice_client.get("/admin/")
    for what, response in responses.items():
        for header, value in HEADERS.items():
            if what == "static file" and header == "X-Frame-Options":
                continue  # served by WhiteNoise ahead of that middleware; frame-ancestors covers it
            assert response.headers.get(header, "").startswith(value), (what, header, response.headers)
    policy = responses["login"].headers["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in policy and "object-src 'none'" in policy


def test_an_unreachable_database_is_a_503_with_retry_after_not_a_500(rf):
    from django.db import OperationalError

    from lab.middleware import server_error

    for path, accept, kind in (
        ("/experiments/", "text/html", "text/html"),
        ("/api/runs/1", "*/*", "application/json"),
    ):
        request = rf.get(path, HTTP_ACCEPT=accept)
        try:
            raise OperationalError("connection refused")
        except OperationalError:
            response = server_error(request)  # as Django calls it: inside the except block
        assert response.status_code == 503 and response["Retry-After"] == "5", path
        assert response["Content-Type"].startswith(kind), path
        assert b"the database cannot be reached right now" in response.content.lower(), path
