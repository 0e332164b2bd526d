"""The claims a team states and tests as API operations (`dashboards.claims.service`)."""

from __future__ import annotations

from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from ninja import Router, Status

from dashboards.claims import service, templates
from dashboards.claims.schemas import ClaimIn, ClaimOut, ClaimsOut, ClaimTemplatesOut, WithdrawnOut
from dashboards.models import Claim
from lab.schemas import responses

router = Router()


def _claim_error(exc: service.ClaimError) -> Status:
    loc = ["body", *exc.field.split(".")]
    return Status(422, {"detail": [{"loc": loc, "field": exc.field, "msg": exc.message}]})


@router.post(
    "/claims", response=responses({201: ClaimOut}, 404, 422), operation_id="dashboards_api_state_claim"
)
def state_claim(request: HttpRequest, body: ClaimIn):
    """State a claim on an experiment or a selection of runs (or make one from a template) and get
    its verdict now. Pre-registered when no run of its cells has finished yet."""
    try:
        return Status(201, service.submit(request.user, body))
    except service.ClaimError as exc:
        return _claim_error(exc)


@router.get("/claims", response=responses({200: ClaimsOut}, 422), operation_id="dashboards_api_list_claims")
def list_claims(request: HttpRequest, experiment: int | None = None):
    """Your teams' claims with their verdicts now, newest first; `experiment` keeps one experiment's."""
    found = Claim.visible_to(request.user).select_related("author")
    if experiment is not None:
        found = found.filter(experiment_id=experiment)
    return {
        "claims": [service.as_dict(claim, service.result(claim)) for claim in found[: service.MAX_LISTED]]
    }


@router.get(
    "/claims/{claim_id}", response=responses({200: ClaimOut}, 404), operation_id="dashboards_api_get_claim"
)
def get_claim(request: HttpRequest, claim_id: int):
    """One claim and its verdict now, every test behind it."""
    claim = get_object_or_404(Claim.visible_to(request.user).select_related("author"), pk=claim_id)
    return service.as_dict(claim, service.result(claim))


@router.delete(
    "/claims/{claim_id}",
    response=responses({200: WithdrawnOut}, 403, 404),
    operation_id="dashboards_api_delete_claim",
)
def delete_claim(request: HttpRequest, claim_id: int):
    """Withdraw a claim: its author or an admin of its team."""
    claim = get_object_or_404(Claim.visible_to(request.user), pk=claim_id)
    if not service.may_withdraw(request.user, claim):
        return Status(403, {"detail": "only its author or an admin of its team can withdraw a claim"})
    withdrawn = claim.pk
    claim.delete()
    return {"claim": withdrawn}


@router.get(
    "/claim-templates",
    response=responses({200: ClaimTemplatesOut}),
    operation_id="dashboards_api_claim_templates",
)
def claim_templates(request: HttpRequest):
    """The claim templates (the paper's three claims): state one with `POST /claims {template}`."""
    keys = ("name", "title", "quantifier", "settings", "parts", "delta")
    return {"templates": [{k: t.get(k) for k in keys} for t in templates.PAPER_TEMPLATES]}
