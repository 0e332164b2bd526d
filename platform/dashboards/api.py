"""The comparison as API operations: exactly what the dashboard draws (`dashboards.compare`; their
operation ids stay those they were published with, `experiments_api_…`), and the claims a team
states and tests (`dashboards.stated`)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from ninja import Query, Router, Status

from dashboards import compare, findings, query, stated
from dashboards.models import Claim
from dashboards.query import ComparisonParams
from dashboards.schemas import ClaimIn, ClaimOut, ClaimsOut, ClaimTemplatesOut, ComparisonOut, WithdrawnOut
from experiments.models import Experiment, Run
from lab.schemas import responses

router = Router()


def _query_error(exc: query.QueryError) -> Status:
    return Status(422, {"detail": [{"loc": ["query", exc.param], "field": exc.param, "msg": exc.message}]})


def _comparison(request: HttpRequest, runs) -> Any:
    try:
        return compare.compare(runs, query.ComparisonQuery.parse(request.GET))
    except query.QueryError as exc:
        return _query_error(exc)


@router.get(
    "/experiments/{experiment_id}/compare",
    response=responses({200: ComparisonOut}, 404, 422),
    by_alias=True,
    operation_id="experiments_api_compare_experiment",
)
def compare_experiment(request: HttpRequest, experiment_id: int, params: Query[ComparisonParams]):
    """The experiment's comparison dashboard as data: one metric per (preset, staleness) group,
    seeds aggregated (mean, band, seeds per point) and downsampled, the final value of each group
    with a 95% bootstrap CI, and per-run final values."""
    experiment = get_object_or_404(Experiment.visible_to(request.user), pk=experiment_id)
    return _comparison(request, experiment.runs.all())


@router.get(
    "/compare",
    response=responses({200: ComparisonOut}, 422),
    by_alias=True,
    operation_id="experiments_api_compare_runs",
)
def compare_runs(request: HttpRequest, runs: str, params: Query[ComparisonParams]):
    """`compare_experiment` for any runs of your teams, `runs=1,2,3`; a line is one preset of one
    experiment, so seeds of different experiments are never averaged together."""
    try:
        picked = query.selected_runs(Run.visible_to(request.user), query.parse_run_ids(request.GET))
    except query.QueryError as exc:
        return _query_error(exc)
    return _comparison(request, picked)


def _claim_error(exc: stated.ClaimError) -> Status:
    loc = ["body", *exc.field.split(".")]
    return Status(422, {"detail": [{"loc": loc, "field": exc.field, "msg": exc.message}]})


@router.post(
    "/claims", response=responses({201: ClaimOut}, 404, 422), operation_id="dashboards_api_state_claim"
)
def state_claim(request: HttpRequest, body: ClaimIn):
    """State a claim on an experiment or a selection of runs (or make one from a template) and get
    its verdict now. Pre-registered when no run of its cells has finished yet."""
    try:
        return Status(201, stated.submit(request.user, body.dict(exclude_none=True)))
    except stated.ClaimError as exc:
        return _claim_error(exc)


@router.get("/claims", response=responses({200: ClaimsOut}, 422), operation_id="dashboards_api_list_claims")
def list_claims(request: HttpRequest, experiment: int | None = None):
    """Your teams' claims with their verdicts now, newest first; `experiment` keeps one experiment's."""
    found = Claim.visible_to(request.user).select_related("author")
    if experiment is not None:
        found = found.filter(experiment_id=experiment)
    return {"claims": [stated.as_dict(claim, stated.result(claim)) for claim in found[: stated.MAX_LISTED]]}


@router.get(
    "/claims/{claim_id}", response=responses({200: ClaimOut}, 404), operation_id="dashboards_api_get_claim"
)
def get_claim(request: HttpRequest, claim_id: int):
    """One claim and its verdict now, every test behind it."""
    claim = get_object_or_404(Claim.visible_to(request.user).select_related("author"), pk=claim_id)
    return stated.as_dict(claim, stated.result(claim))


@router.delete(
    "/claims/{claim_id}",
    response=responses({200: WithdrawnOut}, 403, 404),
    operation_id="dashboards_api_delete_claim",
)
def delete_claim(request: HttpRequest, claim_id: int):
    """Withdraw a claim: its author or an admin of its team."""
    claim = get_object_or_404(Claim.visible_to(request.user), pk=claim_id)
    if not stated.may_withdraw(request.user, claim):
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
    return {"templates": [{k: t.get(k) for k in keys} for t in findings.PAPER_TEMPLATES]}
