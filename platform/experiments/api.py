"""The JSON API at /api (OpenAPI docs at /api/docs).

Every call needs `Authorization: Bearer <token>` (make one with `python manage.py
create_token USERNAME`; only its hash is stored). Objects of teams the caller is not a
member of do not exist for them (404). A sweep is validated exactly like the web form,
through `RunConfig`; problems come back as 422 with one entry per field. The comparison
endpoints return exactly what the dashboard draws (`experiments.compare`). The lists of
experiments and runs come a page at a time (`limit`, `offset`). Every operation declares its
responses, errors included (`experiments.api_schemas`), so /api/openapi.json describes it all.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from django.core.exceptions import ObjectDoesNotExist
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from lab.middleware import DatabaseUnreachable, unavailable_response
from ninja import Field, NinjaAPI, Query, Schema, Status
from ninja.errors import HttpError, ValidationError
from ninja.security import HttpBearer
from pydantic import StringConstraints

from experiments import compare, curves, dispatch, sweeps, throttle
from experiments.api_schemas import ComparisonOut, DocumentedAs, responses
from experiments.models import ApiToken, Experiment, ExperimentActive, MetricPoint, Run, Team
from rlcore.config import RunConfig, StalenessConfig


class TokenAuth(HttpBearer):
    """A bearer token of an active user. Past `LAB_TOKEN_FAILURE_LIMIT` unknown tokens from one
    client address the API answers 429 to that address's unknown tokens (experiments.throttle);
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


class TooManyRequests(Exception):
    def __init__(self, retry_after: int):
        self.retry_after = retry_after


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
    the location without its source (`query`, `path`) and, in a body, without the body's name."""
    detail = [
        {
            "loc": e["loc"],
            "field": ".".join(str(part) for part in e["loc"][2 if e["loc"][0] == "body" else 1 :])
            or e["loc"][0],
            "msg": e["msg"],
        }
        for e in exc.errors
    ]
    return api.create_response(request, {"detail": detail}, status=422)


NoNul = Annotated[str, StringConstraints(pattern=r"^[^\x00]*$")]


class SweepIn(Schema):
    name: Annotated[NoNul, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
    team: NoNul = Field(description="the name of one of your teams")
    description: NoNul = ""
    config: Annotated[dict[str, Any], DocumentedAs(RunConfig)] = Field(
        {},
        description="the base RunConfig of every run (any field left out takes its default); "
        "algorithm.preset, staleness and seed come from presets, staleness and seeds",
    )
    presets: list[str] = Field(description="rlcore presets (python -m rlcore presets), one run each")
    staleness: list[Annotated[dict[str, Any], DocumentedAs(StalenessConfig)]] = Field(
        [{}], description="staleness settings, one run each; {} is on-policy"
    )
    seeds: list[int] = Field([0], description="seeds, one run each")


class SweepOut(Schema):
    experiment: int
    runs: list[int]
    message: str = Field(
        description="that the runs are queued, and whether the message broker could not be reached "
        "(then they are sent to workers as soon as it is back)"
    )


class ExperimentOut(Schema):
    id: int
    name: str
    team: str
    owner: str
    description: str
    created: datetime
    archived: datetime | None
    runs: int
    active: int


API_PAGE_LIMIT = 100
API_MAX_LIMIT = 1000
MAX_OFFSET = 2**63 - 1  # PostgreSQL's OFFSET is a bigint


class PageParams(Schema):
    limit: int = Field(API_PAGE_LIMIT, ge=1, le=API_MAX_LIMIT, description="items per page")
    offset: int = Field(0, ge=0, le=MAX_OFFSET, description="items to skip")


class PageOut(Schema):
    count: int = Field(description="items in all, on every page")
    limit: int
    offset: int
    next: str | None = Field(description="URL of the next page; null on the last")
    previous: str | None = Field(description="URL of the previous page; null on the first")


class ExperimentPageOut(PageOut):
    items: list[ExperimentOut]


def _page(request: HttpRequest, items, page: PageParams) -> tuple[list, dict[str, Any]]:
    """The items of one page of the ordered query `items`, and the page's fields of `PageOut`."""
    count = items.count()
    shown = list(items[page.offset : page.offset + page.limit])

    def url(offset: int) -> str:
        query = request.GET.copy()
        query["offset"], query["limit"] = str(offset), str(page.limit)
        return request.build_absolute_uri(f"{request.path}?{query.urlencode()}")

    fields = {
        "count": count,
        "limit": page.limit,
        "offset": page.offset,
        "next": url(page.offset + page.limit) if page.offset + page.limit < count else None,
        "previous": url(max(0, page.offset - page.limit)) if page.offset > 0 else None,
    }
    return shown, fields


class CancelledOut(Schema):
    cancelled: int = Field(description="runs cancelled: queued ones at once, running ones at their next step")


class DeletedOut(Schema):
    experiment: int
    runs: int
    points: int
    completions: int


class RunOut(Schema):
    id: int
    experiment: int
    preset: str
    staleness: str = Field(
        description="the staleness setting as a label: on-policy, sync_interval=8, sync_offset=4, offline "
        "(the numbers are in the run's config)"
    )
    seed: int
    status: str
    attempt: int
    queue: str
    dispatched_at: datetime | None = Field(
        description="when the current attempt's message was last sent to the broker; null while the "
        "broker could not be reached (a worker's dispatcher sends it when the broker is back)"
    )
    execution_mode: str
    worker: str
    progress: int
    steps: int
    heartbeat: datetime | None
    started: datetime | None
    finished: datetime | None
    error: str
    summary: dict[str, float | None] = Field(
        description="once it ended: steps, completed, eval/accuracy_initial and the latest eval/accuracy, "
        "reward/mean and kl/init (from the points it logged if it failed), collapsed (1 or 0) and "
        "collapsed_step; weights/* and idle/* of distributed and async runs"
    )
    collapsed: bool | None = Field(
        description="its held-out accuracy fell to near zero and stayed there (experiments.collapse); "
        "null until it ended"
    )


class RunPageOut(PageOut):
    items: list[RunOut]


class WarmStartOut(Schema):
    step: int | None
    max_steps: int | None
    accuracy: float | None


class ProgressOut(Schema):
    phase: str = Field(
        description="waiting, starting, preparing, warm_start, training, evaluating, checkpointing; "
        "empty once the run is over"
    )
    text: str = Field(description="the phase in words, as the pages show it")
    step: int
    steps: int
    s_per_step: float | None = Field(description="seconds per trainer step in this attempt so far")
    eta_s: float | None = Field(description="seconds to the last step at that pace")
    warm_start: WarmStartOut | None = Field(description="the tiny model's warm start (first run only)")
    no_worker: str = Field(description="names a queue the run needs that no live worker listens on")
    queue_position: int | None = Field(
        description="while queued: its place among its team's queued runs of its queue (1: next); "
        "teams take turns for workers"
    )


class RunDetailOut(RunOut):
    config: Annotated[dict[str, Any], DocumentedAs(RunConfig)] = Field(
        description="the fully resolved RunConfig"
    )
    rollout_jobs: dict[str, int] = Field(
        description="how many of the run's rollout jobs are in each status (distributed and async runs)"
    )
    progress_report: ProgressOut
    provenance: dict[str, Any] = Field(
        description="theta0_sha256, dataset_sha256 (jsonl tasks), rlcore_version, git_commit, torch, "
        "transformers, vllm, device, torch_threads, host; empty until a worker loaded θ0"
    )


class MetricsOut(Schema):
    run: int
    metrics: dict[str, list[tuple[int, float | None]]] = Field(
        description="per metric name its [step, value] points in step order; null for NaN or infinity"
    )


def _run_out(run: Run) -> dict[str, Any]:
    return {
        **{name: getattr(run, name) for name in RunOut.model_fields if name not in ("experiment", "steps")},
        "experiment": run.experiment_id,
        "steps": run.steps,
    }


def _run_detail_out(run: Run) -> dict[str, Any]:
    return {
        **_run_out(run),
        "config": run.config,
        "rollout_jobs": run.rollout_job_counts(),
        "progress_report": run.progress_report(),
        "provenance": run.provenance,
    }


def _field_errors(errors: list[tuple[str, str]]) -> list[dict[str, Any]]:
    out = []
    for field, message in errors:
        if field not in ("config", "presets", "seeds", "team") and not field.startswith("staleness"):
            field = f"config.{field}"
        out.append({"loc": ["body", "sweep", *field.split(".")], "field": field, "msg": message})
    return out


def _visible_run(request: HttpRequest, run_id: int) -> Run:
    return get_object_or_404(Run.visible_to(request.user).select_related("experiment"), pk=run_id)


@api.post("/sweeps", response=responses({201: SweepOut}, 422))
def submit_sweep(request: HttpRequest, sweep: SweepIn):
    """Create an experiment with one run per preset × staleness setting × seed, and queue them
    (also while the message broker is down: `message` says so). 422 when the team would have more
    queued runs than LAB_TEAM_MAX_QUEUED."""
    team = Team.objects.filter(name=sweep.team, members=request.user).first()
    errors = [] if team else [("team", f"you are not a member of a team called {sweep.team!r}")]
    try:
        grid = sweeps.expand(sweep.config, sweep.presets, sweep.staleness, sweep.seeds)
    except sweeps.SweepError as exc:
        errors += exc.errors
    if errors:
        return Status(422, {"detail": _field_errors(errors)})
    try:
        experiment = sweeps.create_experiment(team, request.user, sweep.name, sweep.description, grid)
    except sweeps.SweepError as exc:  # the team's queued cap
        return Status(422, {"detail": _field_errors(exc.errors)})
    runs = list(experiment.runs.values_list("pk", flat=True))
    message = f"{len(runs)} run{'s' if len(runs) != 1 else ''} queued"
    if experiment.runs.filter(dispatched_at=None).exists():
        message += f"; {dispatch.NOT_SENT}"
    return Status(201, {"experiment": experiment.pk, "runs": runs, "message": message})


@api.get("/experiments", response=responses({200: ExperimentPageOut}, 422))
def list_experiments(request: HttpRequest, page: Query[PageParams], archived: bool = False):
    """Experiments of your teams, newest first, `limit` at a time from `offset`; archived ones too
    with `archived=true`."""
    experiments = (
        Experiment.visible_to(request.user)
        .select_related("team", "owner")
        .annotate(n_runs=Count("runs", distinct=True))
        .order_by("-created", "-id")  # Meta.ordering does not apply to a query with GROUP BY
    )
    if not archived:
        experiments = experiments.filter(archived=None)
    shown, fields = _page(request, experiments, page)
    active = dict(
        Run.objects.filter(experiment__in=shown, status__in=Run.ACTIVE)
        .values_list("experiment")
        .annotate(n=Count("id"))
    )
    return {**fields, "items": [_experiment_out(e, e.n_runs, active.get(e.pk, 0)) for e in shown]}


def _experiment_out(experiment: Experiment, runs: int, active: int) -> dict[str, Any]:
    return {
        "id": experiment.pk,
        "name": experiment.name,
        "team": experiment.team.name,
        "owner": experiment.owner.get_username(),
        "description": experiment.description,
        "created": experiment.created,
        "archived": experiment.archived,
        "runs": runs,
        "active": active,
    }


def _visible_experiment(request: HttpRequest, experiment_id: int) -> Experiment:
    return get_object_or_404(
        Experiment.visible_to(request.user).select_related("team", "owner"), pk=experiment_id
    )


def _counted_experiment_out(experiment: Experiment) -> dict[str, Any]:
    return _experiment_out(
        experiment, experiment.runs.count(), experiment.runs.filter(status__in=Run.ACTIVE).count()
    )


@api.post("/experiments/{experiment_id}/cancel", response=responses({200: CancelledOut}, 404, 422))
def cancel_experiment(request: HttpRequest, experiment_id: int):
    """Cancel every queued or running run of the experiment (and their rollout jobs)."""
    return {"cancelled": _visible_experiment(request, experiment_id).cancel()}


@api.post("/experiments/{experiment_id}/archive", response=responses({200: ExperimentOut}, 404, 422))
def archive_experiment(request: HttpRequest, experiment_id: int):
    """Hide the experiment from the lists (`GET /experiments` shows it with `archived=true`)."""
    experiment = _visible_experiment(request, experiment_id)
    experiment.archive()
    return _counted_experiment_out(experiment)


@api.post("/experiments/{experiment_id}/unarchive", response=responses({200: ExperimentOut}, 404, 422))
def unarchive_experiment(request: HttpRequest, experiment_id: int):
    experiment = _visible_experiment(request, experiment_id)
    experiment.unarchive()
    return _counted_experiment_out(experiment)


@api.delete("/experiments/{experiment_id}", response=responses({200: DeletedOut}, 403, 404, 409, 422))
def delete_experiment(request: HttpRequest, experiment_id: int):
    """Delete the experiment, its runs, everything they logged and their files. Team admins only;
    409 while a run is queued or running (cancel it first)."""
    experiment = _visible_experiment(request, experiment_id)
    if not experiment.team.is_admin(request.user):
        raise HttpError(403, f"only admins of team {experiment.team} can delete its experiments")
    report = experiment.deletion_report()
    try:
        experiment.delete_with_files()
    except ExperimentActive as exc:
        raise HttpError(409, str(exc)) from exc
    return {"experiment": experiment_id, **report}


@api.get("/experiments/{experiment_id}/runs", response=responses({200: RunPageOut}, 404, 422))
def list_runs(request: HttpRequest, experiment_id: int, page: Query[PageParams]):
    """The experiment's runs in the order they were queued, `limit` at a time from `offset`."""
    experiment = get_object_or_404(Experiment.visible_to(request.user), pk=experiment_id)
    shown, fields = _page(request, experiment.runs.order_by("id"), page)
    return {**fields, "items": [_run_out(run) for run in shown]}


@api.get("/runs/{run_id}", response=responses({200: RunDetailOut}, 404, 422))
def get_run(request: HttpRequest, run_id: int):
    return _run_detail_out(_visible_run(request, run_id))


@api.get(
    "/runs/{run_id}/metrics",
    response=responses({200: MetricsOut}, 404, 422),
    openapi_extra={
        "responses": {
            200: {
                "content": {
                    "text/csv": {"schema": {"type": "string", "description": "name,step,value,wall_time"}}
                }
            }
        }
    },
)
def get_metrics(request: HttpRequest, run_id: int, format: Literal["json", "csv"] = "json", name: NoNul = ""):
    """Every metric point of the run: JSON `{name: [[step, value], ...]}` or CSV `name,step,value,wall_time`."""
    run = _visible_run(request, run_id)
    if format == "csv":
        response = HttpResponse(run.metrics_csv(name), content_type="text/csv")
        response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-metrics.csv"'
        return response
    points = MetricPoint.objects.filter(run=run).order_by("name", "step")
    if name:
        points = points.filter(name=name)
    metrics: dict[str, list[list[float | None]]] = {}
    for metric, step, value in points.values_list("name", "step", "value"):
        metrics.setdefault(metric, []).append([step, value])
    return {"run": run.pk, "metrics": metrics}


class ComparisonParams(Schema):
    """The dashboard's query (documented here; `ComparisonQuery.parse` validates it, as for the page)."""

    metric: str = compare.ComparisonQuery.metric
    x: str = Field(compare.ComparisonQuery.x, description=f"one of {', '.join(curves.X_AXES)}")
    band: str = Field(compare.ComparisonQuery.band, description=f"one of {', '.join(curves.BANDS)}")
    rule: str = Field(
        compare.ComparisonQuery.rule, description=f"final value: one of {', '.join(curves.RULES)}"
    )
    k: str = Field(str(compare.ComparisonQuery.k), description="the k of mean_last_k")
    delta: str = Field(
        str(compare.ComparisonQuery.delta),
        description="δ: the change of the final value that counts, for the staleness tolerance and the findings "
        "(in the metric's units: 0.02 is 2 points of accuracy)",
    )


def _query_error(exc: compare.QueryError) -> Status:
    return Status(422, {"detail": [{"loc": ["query", exc.param], "field": exc.param, "msg": exc.message}]})


def _comparison(request: HttpRequest, runs) -> Any:
    try:
        return compare.compare(runs, compare.ComparisonQuery.parse(request.GET))
    except compare.QueryError as exc:
        return _query_error(exc)


@api.get(
    "/experiments/{experiment_id}/compare", response=responses({200: ComparisonOut}, 404, 422), by_alias=True
)
def compare_experiment(request: HttpRequest, experiment_id: int, params: Query[ComparisonParams]):
    """The experiment's comparison dashboard as data: one metric per (preset, staleness) group,
    seeds aggregated (mean, band, seeds per point) and downsampled, the final value of each group
    with a 95% bootstrap CI, and per-run final values."""
    experiment = get_object_or_404(Experiment.visible_to(request.user), pk=experiment_id)
    return _comparison(request, experiment.runs.all())


@api.get("/compare", response=responses({200: ComparisonOut}, 422), by_alias=True)
def compare_runs(request: HttpRequest, runs: str, params: Query[ComparisonParams]):
    """`compare_experiment` for any runs of your teams, `runs=1,2,3`; a line is one preset of one
    experiment, so seeds of different experiments are never averaged together."""
    try:
        picked = compare.selected_runs(Run.visible_to(request.user), compare.parse_run_ids(request.GET))
    except compare.QueryError as exc:
        return _query_error(exc)
    return _comparison(request, picked)


@api.post("/runs/{run_id}/cancel", response=responses({200: RunDetailOut}, 404, 409, 422))
def cancel_run(request: HttpRequest, run_id: int):
    """Cancel a queued run now, or a running one at its next step."""
    run = _visible_run(request, run_id)
    if not run.cancel():  # a run deleted meanwhile: Run.DoesNotExist, a 404 (lab.middleware)
        raise HttpError(409, f"run {run.pk} is {run.status}; only queued or running runs can be cancelled")
    return _run_detail_out(run)


@api.post("/runs/{run_id}/retry", response=responses({200: RunDetailOut}, 404, 409, 422))
def retry_run(request: HttpRequest, run_id: int):
    """Queue a new attempt of a failed, cancelled or lost run; it resumes from its last checkpoint
    (also while the message broker is down: then `dispatched_at` is null). 409 when the run has no
    attempts left or its team already has LAB_TEAM_MAX_QUEUED queued runs."""
    run = _visible_run(request, run_id)
    refusal = run.retry_refusal()
    if refusal or not run.retry():  # a run deleted meanwhile: Run.DoesNotExist, a 404 (lab.middleware)
        raise HttpError(409, refusal or run.retry_refusal())
    return _run_detail_out(run)
