"""Response headers every page gets, and the answers to two faults that are not bugs: the
database being unreachable (503 with Retry-After, never a 500) and an object deleted while a
request worked on it (404, as if it had never been there)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string

log = logging.getLogger(__name__)

# What PostgreSQL down or restarting looks like to Django (SQLite: a locked or missing file).
DatabaseUnreachable = (OperationalError, InterfaceError)
RETRY_AFTER_S = 5
UNAVAILABLE = "the database cannot be reached right now; try again in a few seconds"


def unavailable_response(request: HttpRequest, exc: Exception) -> HttpResponse:
    """503 with Retry-After: JSON for the API and data URLs, a page otherwise."""
    log.warning("%s %s: database unreachable (%s: %s)", request.method, request.path, type(exc).__name__, exc)
    if request.path.startswith("/api/") or "text/html" not in request.headers.get("Accept", ""):
        response: HttpResponse = JsonResponse({"detail": UNAVAILABLE}, status=503)
    else:
        response = HttpResponse(render_to_string("503.html", {"message": UNAVAILABLE}), status=503)
    response["Retry-After"] = str(RETRY_AFTER_S)
    return response


def server_error(request: HttpRequest) -> HttpResponse:
    """`handler500`: Django calls it for any exception nothing else handled, inside its `except`
    block, wherever it was raised (a view, a middleware saving the session). An unreachable
    database is an outage, not a bug: 503 with Retry-After."""
    exc = sys.exc_info()[1]
    if isinstance(exc, DatabaseUnreachable):
        return unavailable_response(request, exc)
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Internal Server Error"}, status=500)
    return HttpResponse(render_to_string("500.html"), status=500)


class DeletedMeanwhileMiddleware:
    """An object deleted while a view worked on it (a retry racing a delete) is a 404, as if it
    had never been there."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        if isinstance(exc, ObjectDoesNotExist):
            raise Http404(str(exc)) from exc
        return None


class ContentSecurityPolicyMiddleware:
    """Adds `settings.CONTENT_SECURITY_POLICY` as the Content-Security-Policy header of every
    response that has none of its own."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response
        self.policy = "; ".join(
            f"{directive} {' '.join(sources)}"
            for directive, sources in settings.CONTENT_SECURITY_POLICY.items()
        )

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        response.headers.setdefault("Content-Security-Policy", self.policy)
        return response
