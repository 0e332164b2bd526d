"""Rate limits on guessing, counted in the real cache (Redis in CI): 100 wrong passwords or 300
wrong API tokens from one address are refused with 429 once past the limit, while the right
password from another address, another user from the same address, and a good token from
another address still get in; the admin's login is limited too."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import Client, override_settings
from django.urls import reverse
from support import free_port

from accounts import throttle
from accounts.models import ApiToken

pytestmark = pytest.mark.django_db

ATTACKER, ELSEWHERE = "203.0.113.7", "198.51.100.20"


@pytest.fixture(autouse=True)
def fast_password_hashes(settings):
    """Hundreds of password checks: a fast hash for the users these tests make (set up first)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def log_in(username: str, password: str, address: str, path: str | None = None):
    client = Client(REMOTE_ADDR=address)
    response = client.post(path or reverse("login"), {"username": username, "password": password})
    return response, client


def logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


@pytest.fixture
def bob(django_user_model):
    return django_user_model.objects.create_user("bob", password="bob-password-1")


def test_wrong_passwords_are_refused_with_429_after_the_limit_and_others_still_log_in(alice, bob):
    limit = settings.LAB_LOGIN_FAILURE_LIMIT
    statuses = [log_in("alice", f"guess-{i}", ATTACKER)[0].status_code for i in range(100)]
    assert statuses == [200] * limit + [429] * (100 - limit)

    refused, client = log_in("alice", "alice-password-1", ATTACKER)
    assert refused.status_code == 429 and int(refused["Retry-After"]) == settings.LAB_RATE_WINDOW_S
    assert "Too many failed logins; wait up to 15 minutes, then try again." in refused.content.decode()
    assert not logged_in(client)

    for username, address in [("alice", ELSEWHERE), ("bob", ATTACKER)]:
        response, client = log_in(username, f"{username}-password-1", address)
        assert response.status_code == 302 and logged_in(client), (username, address)


@override_settings(LAB_LOGIN_FAILURE_LIMIT=2)
def test_one_address_guessing_many_usernames_and_one_username_from_many_addresses_are_limited(alice, bob):
    wide = 2 * throttle.WIDE_FACTOR
    sprayed = [log_in(f"user{i}", "guess", ATTACKER)[0].status_code for i in range(wide + 3)]
    assert sprayed == [200] * wide + [429] * 3
    assert log_in("bob", "bob-password-1", ATTACKER)[0].status_code == 429

    spread = [log_in("bob", "guess", f"192.0.2.{i}")[0].status_code for i in range(wide + 3)]
    assert spread == [200] * wide + [429] * 3
    assert log_in("alice", "alice-password-1", ELSEWHERE)[0].status_code == 302


@override_settings(LAB_LOGIN_FAILURE_LIMIT=3)
def test_the_admin_login_is_limited_too(admin_user):
    for i in range(3):
        assert not logged_in(log_in("admin", f"guess-{i}", ATTACKER, "/admin/login/")[1])
    response, client = log_in("admin", "password", ATTACKER, "/admin/login/")
    assert not logged_in(client) and "Too many failed logins" in response.content.decode()
    assert logged_in(log_in("admin", "password", ELSEWHERE, "/admin/login/")[1])


@override_settings(LAB_CLIENT_IP_HEADER="X-Real-IP", LAB_LOGIN_FAILURE_LIMIT=2)
def test_behind_the_proxy_the_limits_count_the_address_it_passes_on(alice):
    proxy = Client(REMOTE_ADDR="172.18.0.5")
    for i in range(3):
        proxy.post(reverse("login"), {"username": "alice", "password": f"x{i}"}, HTTP_X_REAL_IP=ATTACKER)
    right = {"username": "alice", "password": "alice-password-1"}
    assert proxy.post(reverse("login"), right, HTTP_X_REAL_IP=ATTACKER).status_code == 429
    assert proxy.post(reverse("login"), right, HTTP_X_REAL_IP=ELSEWHERE).status_code == 302


def test_wrong_tokens_are_refused_with_429_after_the_limit_while_known_tokens_still_work(alice):
    limit = settings.LAB_TOKEN_FAILURE_LIMIT
    attacker = Client(REMOTE_ADDR=ATTACKER)
    statuses = [
        attacker.get("/api/experiments", HTTP_AUTHORIZATION=f"Bearer guess-{i}").status_code
        for i in range(300)
    ]
    assert statuses == [401] * limit + [429] * (300 - limit)
    refused = attacker.get("/api/experiments", HTTP_AUTHORIZATION="Bearer one-more-guess")
    assert refused.status_code == 429 and int(refused["Retry-After"]) == settings.LAB_RATE_WINDOW_S
    assert "Too many failed API token checks from your address" in refused.json()["detail"]

    # A guesser behind the same address (a proxy, a shared NAT) locks nobody with a real token out.
    token = ApiToken.issue(alice)
    assert attacker.get("/api/experiments", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 200
    assert attacker.get("/api/experiments", HTTP_AUTHORIZATION="Bearer guess").status_code == 429

    elsewhere = Client(REMOTE_ADDR=ELSEWHERE)
    assert elsewhere.get("/api/experiments", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 200
    assert elsewhere.get("/api/experiments", HTTP_AUTHORIZATION="Bearer guess").status_code == 401


def test_with_the_cache_unreachable_the_limits_fail_open(alice, caplog):
    unreachable = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{free_port()}/0",  # nothing listens there
            "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
        }
    }
    token = ApiToken.issue(alice)
    with override_settings(CACHES=unreachable, LAB_LOGIN_FAILURE_LIMIT=2, LAB_TOKEN_FAILURE_LIMIT=2):
        assert [log_in("alice", "guess", ATTACKER)[0].status_code for _ in range(4)] == [200] * 4
        response, client = log_in("alice", "alice-password-1", ATTACKER)
        assert response.status_code == 302 and logged_in(client)
        api = Client(REMOTE_ADDR=ATTACKER)
        assert [api.get("/api/experiments", HTTP_AUTHORIZATION="Bearer x").status_code for _ in range(4)] == [
            401
        ] * 4
        assert api.get("/api/experiments", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 200
    assert "the cache is unreachable" in caplog.text
