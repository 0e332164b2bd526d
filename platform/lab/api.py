"""The JSON API at /api (OpenAPI docs at /api/docs): one NinjaAPI that mounts each room's router
(`experiments.api`: sweeps, experiments, runs; `dashboards.comparison.api`: comparisons;
`dashboards.claims.api`: claims; `dashboards.reports.api`: reports; `imports.api`: runs imported
from other tools' files) and answers every error the
same way. Every call needs `Authorization: Bearer <token>` (`accounts.auth`); objects of teams the
caller is not a member of do not exist for them (404)."""

from __future__ import annotations

from django.core.exceptions import ObjectDoesNotExist
from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import ValidationError

from accounts import throttle
from accounts.auth import TokenAuth, TooManyRequests
from dashboards.claims.api import router as claims_router
from dashboards.comparison.api import router as comparison_router
from dashboards.reports.api import router as reports_router
from experiments.api import router as experiments_router
from imports.api import router as imports_router
from lab.middleware import DatabaseUnreachable, unavailable_response
from lab.schemas import RULE

api = NinjaAPI(title="Off-Policy Lab", version="1", auth=TokenAuth(), urls_namespace="api")


@api.exception_handler(TooManyRequests)
def too_many_requests(request: HttpRequest, exc: TooManyRequests) -> HttpResponse:
    response = api.create_response(
        request,
        {"detail": throttle.refusal("API token checks from your address", exc.retry_after)},
        status=429,
    )
    response["Retry-After"] = str(exc.retry_after)
    return response


@api.exception_handler(ObjectDoesNotExist)
def gone(request: HttpRequest, exc: ObjectDoesNotExist) -> HttpResponse:
    """An object deleted while the request worked on it (a retry racing a delete): as if it had
    never been there."""
    return api.create_response(request, {"detail": "Not Found"}, status=404)


def database_unreachable(request: HttpRequest, exc: Exception) -> HttpResponse:
    """503 with Retry-After, never a 500, while the database cannot be reached."""
    return unavailable_response(request, exc)


for _unreachable in DatabaseUnreachable:
    api.add_exception_handler(_unreachable, database_unreachable)


@api.exception_handler(ValidationError)
def request_validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    """Malformed requests get the same 422 shape as invalid sweeps: loc, field, msg. The field is
    the location without its source (`query`, `path`) and, in a body, without the body's name; a
    rule a field breaks in the lab's words (`lab.schemas.RULE`) is located as a `FieldError` is,
    the source then the field's path, as text (["body", "parts", "0", "kind"])."""
    detail = []
    for e in exc.errors:
        field = ".".join(str(part) for part in e["loc"][2 if e["loc"][0] == "body" else 1 :]) or e["loc"][0]
        loc = [e["loc"][0], *field.split(".")] if e["type"] == RULE else e["loc"]
        detail.append({"loc": loc, "field": field, "msg": e["msg"]})
    return api.create_response(request, {"detail": detail}, status=422)


api.add_router("", experiments_router)
api.add_router("", comparison_router)
api.add_router("", claims_router)
api.add_router("", reports_router)
api.add_router("", imports_router)
