"""The comparison as API operations: exactly what the dashboard draws (`dashboards.comparison.compare`;
their operation ids stay those they were published with, `experiments_api_…`)."""

from __future__ import annotations

from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from ninja import Query, Router, Status

from dashboards.comparison import compare, query
from dashboards.comparison.query import ComparisonParams
from dashboards.comparison.schemas import ComparisonOut
from experiments.models import Experiment, Run
from lab.schemas import responses

router = Router()


def _query_error(exc: query.QueryError) -> Status:
    return Status(422, {"detail": [{"loc": ["query", exc.param], "field": exc.param, "msg": exc.message}]})


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
    return compare.compare(experiment.runs.all(), params.query())


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
    return compare.compare(picked, params.query())
