"""The claims' pages: the comparison page states claims and lists its target's (`claims_data`,
`claim_new`, as JSON for its script), and each claim has a permalink page with its verdict and every
test behind it. Other teams' claims are 404s."""

from __future__ import annotations

import json

import pydantic
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from dashboards.claims import service
from dashboards.claims.schemas import ClaimIn
from dashboards.comparison import query
from dashboards.models import Claim


def _errors(field: str, message: str) -> JsonResponse:
    return JsonResponse({"detail": [{"field": field, "msg": message}]}, status=422)


@login_required
def claims_data(request: HttpRequest) -> HttpResponse:
    """The claims on `?experiment=ID`, or on exactly the runs `?runs=…`, with their verdicts now."""
    found = Claim.visible_to(request.user).select_related("author", "team")
    if "experiment" in request.GET:
        if not request.GET["experiment"].isdigit():
            return _errors("experiment", "experiment must be an experiment id")
        found = found.filter(experiment_id=int(request.GET["experiment"]))
    else:
        try:
            ids = sorted(query.parse_run_ids(request.GET))
        except query.QueryError as exc:
            return _errors(exc.param, exc.message)
        found = found.filter(experiment=None, run_ids=ids)
    claims = [service.as_dict(claim, service.result(claim)) for claim in found[: service.MAX_LISTED]]
    return JsonResponse({"claims": claims})


@login_required
@require_POST
def claim_new(request: HttpRequest) -> HttpResponse:
    """State a claim from the comparison page: a JSON body as the API's `POST /api/claims` takes."""
    try:
        body = ClaimIn(**json.loads(request.body or b"{}"))
    except json.JSONDecodeError:
        return _errors("body", "the body must be a JSON object")
    except TypeError as exc:
        return _errors("body", str(exc))
    except pydantic.ValidationError as exc:
        error = service.ClaimError.first_of(exc)
        return _errors(error.field, error.message)
    try:
        return JsonResponse(service.submit(request.user, body), status=201)
    except service.ClaimError as exc:
        return _errors(exc.field, exc.message)


@login_required
def claim_detail(request: HttpRequest, claim_id: int) -> HttpResponse:
    claim = get_object_or_404(Claim.visible_to(request.user).select_related("author", "team"), pk=claim_id)
    outcome = service.as_dict(claim, service.result(claim))
    return render(
        request,
        "dashboards/claim.html",
        {
            "claim": claim,
            "outcome": outcome,
            "confidence": round(100 * outcome["confidence"]),
            "compare_query": f"metric={claim.metric}&rule={claim.rule}&k={claim.k}&delta={claim.delta:g}",
            "may_withdraw": service.may_withdraw(request.user, claim),
        },
    )


@login_required
@require_POST
def claim_withdraw(request: HttpRequest, claim_id: int) -> HttpResponse:
    claim = get_object_or_404(Claim.visible_to(request.user), pk=claim_id)
    if not service.may_withdraw(request.user, claim):
        return HttpResponse("Only its author or an admin of its team can withdraw a claim.", status=403)
    experiment = claim.experiment_id
    claim.delete()
    if experiment is not None:
        return redirect("experiment-compare", experiment)
    return redirect("run-list")
