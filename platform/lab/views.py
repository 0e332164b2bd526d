"""Pages of the project itself: the readiness check, and the old admin addresses of models that
moved to another app."""

from __future__ import annotations

import os
import platform

from django.db import connection
from django.http import HttpRequest, HttpResponsePermanentRedirect, JsonResponse

from lab.middleware import RETRY_AFTER_S, DatabaseUnreachable
from lab.moves import MOVED_FROM_EXPERIMENTS


def health(request: HttpRequest) -> JsonResponse:
    """Readiness for load balancers, `manage.py up` and tests: 200 while this web process can
    reach the database, else 503 with Retry-After. `worker` tells the web server's processes
    apart (`up` waits for each); `system` shows the stdlib `platform` module works here."""
    body = {
        "status": "ok",
        "database": "ok",
        "worker": os.getpid(),
        "system": platform.system(),
        "python": platform.python_version(),
    }
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseUnreachable as exc:
        body |= {"status": "unavailable", "database": f"unreachable ({type(exc).__name__})"}
        response = JsonResponse(body, status=503)
        response["Retry-After"] = str(RETRY_AFTER_S)
        return response
    return JsonResponse(body)


def moved_admin(request: HttpRequest, model: str, rest: str) -> HttpResponsePermanentRedirect:
    """`/admin/experiments/team/…` → `/admin/accounts/team/…` (query string kept): bookmarks of the
    admin's pages keep working after teams, tokens and workers moved to their own apps."""
    query = f"?{request.META['QUERY_STRING']}" if request.META.get("QUERY_STRING") else ""
    return HttpResponsePermanentRedirect(f"/admin/{MOVED_FROM_EXPERIMENTS[model]}/{model}/{rest}{query}")
