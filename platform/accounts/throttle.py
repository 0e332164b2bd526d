"""Rate limits on guessing passwords and API tokens, counted in Django's cache for
`LAB_RATE_WINDOW_S`: failed logins per username and client address (a refused login is a 429,
checked before the password), unknown tokens per address (a known token always gets through).
The limits fail open when the cache is unreachable (docs/architecture.md, "The web tier's plumbing")."""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth.backends import ModelBackend, UserModel
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest

log = logging.getLogger(__name__)

WIDE_FACTOR = 5


@dataclass(frozen=True)
class Counter:
    """Failures of one kind for one subject (a username, an address, or both)."""

    kind: str
    subject: tuple[str, ...]
    limit: int

    @property
    def key(self) -> str:
        digest = hashlib.sha256("\0".join(self.subject).encode()).hexdigest()[:32]
        return f"throttle:{self.kind}:{digest}"


def client_address(request: HttpRequest | None) -> str:
    if request is None:
        return ""
    header = settings.LAB_CLIENT_IP_HEADER
    if header:
        forwarded = request.META.get("HTTP_" + header.upper().replace("-", "_"), "")
        if forwarded.strip():
            return forwarded.split(",")[-1].strip()
    return request.META.get("REMOTE_ADDR", "")


def retry_after(counters: list[Counter]) -> int | None:
    """Seconds to wait at most if any counter has reached its limit, else None."""
    try:
        counts = cache.get_many([counter.key for counter in counters])
    except Exception:
        log.warning("rate limits not checked: the cache is unreachable", exc_info=True)
        return None
    if any(counts.get(counter.key, 0) >= counter.limit for counter in counters):
        return settings.LAB_RATE_WINDOW_S
    return None


def record_failure(counters: list[Counter]) -> None:
    """Count one failure on each counter; a counter's window starts with its first failure."""
    window = settings.LAB_RATE_WINDOW_S
    try:
        for counter in counters:
            if cache.add(counter.key, 1, timeout=window):
                continue
            try:
                cache.incr(counter.key)
            except ValueError:  # its window ended in between
                cache.add(counter.key, 1, timeout=window)
    except Exception:
        log.warning("a failure was not counted: the cache is unreachable", exc_info=True)


def login_counters(request: HttpRequest | None, username: str) -> list[Counter]:
    limit = settings.LAB_LOGIN_FAILURE_LIMIT
    address, username = client_address(request), username.casefold()
    return [
        Counter("login", (username, address), limit),
        Counter("login-user", (username,), limit * WIDE_FACTOR),
        Counter("login-address", (address,), limit * WIDE_FACTOR),
    ]


def token_counters(request: HttpRequest) -> list[Counter]:
    return [Counter("token", (client_address(request),), settings.LAB_TOKEN_FAILURE_LIMIT)]


def refusal(what: str, seconds: int) -> str:
    minutes = math.ceil(seconds / 60)
    return (
        f"Too many failed {what}; wait up to {minutes} minute{'s' if minutes != 1 else ''}, then try again."
    )


class ThrottledModelBackend(ModelBackend):
    """Django's username/password check, refused past the login limits (see the module).

    A refusal ends authentication (no other backend is asked) and leaves the seconds to wait
    on `request.login_retry_after`, for the login form to say so."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if username is None:
            username = kwargs.get(UserModel.USERNAME_FIELD)
        if username is None or password is None:
            return None
        counters = login_counters(request, str(username))
        if (seconds := retry_after(counters)) is not None:
            if request is not None:
                request.login_retry_after = seconds
            raise PermissionDenied
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            record_failure(counters)
        return user
