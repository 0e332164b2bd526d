"""The API's authentication: a bearer token of an active user, rate-limited against guessing."""

from __future__ import annotations

from django.http import HttpRequest
from ninja.security import HttpBearer

from accounts import throttle
from accounts.models import ApiToken


class TooManyRequests(Exception):
    def __init__(self, retry_after: int):
        self.retry_after = retry_after


class TokenAuth(HttpBearer):
    """A bearer token of an active user. Past `LAB_TOKEN_FAILURE_LIMIT` unknown tokens from one
    client address the API answers 429 to that address's unknown tokens (accounts.throttle);
    a known token still gets through, so a guesser cannot lock a team out of the API."""

    def authenticate(self, request: HttpRequest, token: str):
        user = ApiToken.user_for(token)
        if user is not None:
            request.user = user
            return user
        counters = throttle.token_counters(request)
        if (seconds := throttle.retry_after(counters)) is not None:
            raise TooManyRequests(seconds)
        throttle.record_failure(counters)
        return None
