"""The API's sweep, experiment and run operations (mounted by `lab.api`). A sweep is validated
exactly like the web form, through `RunConfig`; problems come back as 422 with one entry per
field. The lists of experiments and runs come a page at a time (`limit`, `offset`)."""

from __future__ import annotations

from typing import Any, Literal

from django.core.exceptions import PermissionDenied
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from ninja import Query, Router, Status
from ninja.errors import HttpError

from accounts.models import Team
from execution.messages import NOT_SENT
from experiments import progress, series, sweeps, tagging
from experiments.models import Experiment, ExperimentNotDeletable, Note, Run, SavedView
from experiments.run_csv import metrics_csv
from experiments.schemas import (
    CancelledOut,
    DeletedOut,
    ExperimentOut,
    ExperimentPageOut,
    MetricsOut,
    NoteDeletedOut,
    NoteIn,
    NoteOut,
    PageParams,
    RunDetailOut,
    RunOut,
    RunPageOut,
    RunTagsIn,
    SeedsIn,
    SeedsOut,
    SweepIn,
    SweepOut,
    TaggedOut,
    TagsIn,
    TagsOut,
    ViewDeletedOut,
    ViewIn,
    ViewOut,
    ViewsOut,
)
from lab.schemas import NoNul, responses

router = Router()


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


def _run_out(run: Run) -> dict[str, Any]:
    computed = ("experiment", "steps", "tags", "imported")
    return {
        **{name: getattr(run, name) for name in RunOut.model_fields if name not in computed},
        "experiment": run.experiment_id,
        "steps": run.steps,
        "tags": [tag.name for tag in run.tags.all()],
        "imported": run.is_imported,
    }


def _imported_from(run: Run) -> dict[str, Any] | None:
    if not run.is_imported:
        return None
    record = run.imported
    fields = (
        "tool",
        "tool_version",
        "original_run_id",
        "file_name",
        "file_size",
        "sha256",
        "run_name",
        "mapping",
        "points",
    )
    return {
        **{name: getattr(record, name) for name in fields},
        "first_time": record.first_time,
        "last_time": record.last_time,
        "imported_by": record.imported_by.get_username() if record.imported_by else None,
        "imported_at": record.imported_at,
    }


def _run_detail_out(run: Run) -> dict[str, Any]:
    return {
        **_run_out(run),
        "config": run.config,
        "rollout_jobs": run.rollout_job_counts(),
        "progress_report": progress.run_progress(run),
        "provenance": run.provenance,
        "provenance_history": run.provenance_history,
        "imported_from": _imported_from(run),
    }


def _field_errors(errors: list[tuple[str, str]]) -> list[dict[str, Any]]:
    out = []
    for field, message in errors:
        if field not in ("config", "presets", "seeds", "team") and field.split(".")[0] not in (
            "staleness",
            "axes",
        ):
            field = f"config.{field}"
        out.append({"loc": ["body", "sweep", *field.split(".")], "field": field, "msg": message})
    return out


def _visible_run(request: HttpRequest, run_id: int) -> Run:
    return get_object_or_404(
        Run.visible_to(request.user).select_related("experiment", "imported__imported_by"), pk=run_id
    )


@router.post("/sweeps", response=responses({201: SweepOut}, 422))
def submit_sweep(request: HttpRequest, sweep: SweepIn):
    """Create an experiment with one run per preset × staleness setting × axes' values × seed, and queue them
    (also while the message broker is down: `message` says so). 422 when the team would have more
    queued runs than LAB_TEAM_MAX_QUEUED."""
    try:
        experiment = sweeps.submit(request.user, sweep)
    except sweeps.SweepError as exc:
        return Status(422, {"detail": _field_errors(exc.errors)})
    runs = list(experiment.runs.values_list("pk", flat=True))
    message = f"{len(runs)} run{'s' if len(runs) != 1 else ''} queued"
    if experiment.runs.filter(dispatched_at=None).exists():
        message += f"; {NOT_SENT}"
    return Status(201, {"experiment": experiment.pk, "runs": runs, "message": message})


@router.get("/experiments", response=responses({200: ExperimentPageOut}, 422))
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


@router.post("/experiments/{experiment_id}/cancel", response=responses({200: CancelledOut}, 404, 422))
def cancel_experiment(request: HttpRequest, experiment_id: int):
    """Cancel every queued or running run of the experiment (and their rollout jobs)."""
    return {"cancelled": _visible_experiment(request, experiment_id).cancel()}


@router.post("/experiments/{experiment_id}/seeds", response=responses({201: SeedsOut}, 404, 422))
def add_seeds(request: HttpRequest, experiment_id: int, body: SeedsIn):
    """Queue every cell of the experiment's sweep again with its next `seeds` seeds, into the same
    experiment: its comparison, claims and reports pick them up. Checked as a new sweep is (422 over
    the team's queued cap, naming the field)."""
    experiment = _visible_experiment(request, experiment_id)
    try:
        runs = sweeps.add_seeds(experiment, request.user, body.seeds)
    except sweeps.SweepError as exc:
        return Status(422, {"detail": _field_errors(exc.errors)})
    added = sorted({run.seed for run in runs})
    return Status(201, {"experiment": experiment.pk, "seeds": added, "runs": [run.pk for run in runs]})


@router.post("/experiments/{experiment_id}/archive", response=responses({200: ExperimentOut}, 404, 422))
def archive_experiment(request: HttpRequest, experiment_id: int):
    """Hide the experiment from the lists (`GET /experiments` shows it with `archived=true`)."""
    experiment = _visible_experiment(request, experiment_id)
    experiment.archive()
    return _counted_experiment_out(experiment)


@router.post("/experiments/{experiment_id}/unarchive", response=responses({200: ExperimentOut}, 404, 422))
def unarchive_experiment(request: HttpRequest, experiment_id: int):
    experiment = _visible_experiment(request, experiment_id)
    experiment.unarchive()
    return _counted_experiment_out(experiment)


@router.delete("/experiments/{experiment_id}", response=responses({200: DeletedOut}, 403, 404, 409, 422))
def delete_experiment(request: HttpRequest, experiment_id: int):
    """Delete the experiment, its runs, everything they logged and their files. Team admins only;
    409 while a run is queued or running (cancel it first)."""
    experiment = _visible_experiment(request, experiment_id)
    if not experiment.team.is_admin(request.user):
        raise HttpError(403, f"only admins of team {experiment.team} can delete its experiments")
    report = experiment.deletion_report()
    try:
        experiment.delete_with_files()
    except ExperimentNotDeletable as exc:
        raise HttpError(409, str(exc)) from exc
    return {"experiment": experiment_id, **report}


@router.get("/experiments/{experiment_id}/runs", response=responses({200: RunPageOut}, 404, 422))
def list_runs(request: HttpRequest, experiment_id: int, page: Query[PageParams]):
    """The experiment's runs in the order they were queued, `limit` at a time from `offset`."""
    experiment = get_object_or_404(Experiment.visible_to(request.user), pk=experiment_id)
    shown, fields = _page(
        request, experiment.runs.order_by("id").select_related("imported").prefetch_related("tags"), page
    )
    return {**fields, "items": [_run_out(run) for run in shown]}


def _tagging_error(exc: tagging.TaggingError, source: str = "body") -> Status:
    entry = {"loc": [source, *exc.field.split(".")], "field": exc.field, "msg": exc.message}
    if exc.position is not None:
        entry["position"] = exc.position
    return Status(422, {"detail": [entry]})


@router.get("/runs", response=responses({200: RunPageOut}, 422))
def search_runs(request: HttpRequest, page: Query[PageParams], q: NoNul = ""):
    """Runs of your teams, newest first, that the runs query `q` matches (all without one): fields,
    config paths, tags, status and summaries of a metric, with and, or, not and parentheses; e.g.
    `algorithm.preset = m2po and staleness.sync_offset >= 8 and last(eval/accuracy) > 0.6`. A
    mistake is a 422 whose `position` points at it. The grammar: `experiments.runquery`."""
    try:
        runs = tagging.matching(request.user, q)
    except tagging.TaggingError as exc:
        return _tagging_error(exc, "query")
    shown, fields = _page(
        request, runs.order_by("-pk").select_related("imported").prefetch_related("tags"), page
    )
    return {**fields, "items": [_run_out(run) for run in shown]}


@router.post("/runs/tags", response=responses({200: TaggedOut}, 422))
def tag_runs(request: HttpRequest, body: RunTagsIn):
    """Add and remove tags on many runs at once: those listed in `runs`, or every run of your teams
    that the query `q` matches."""
    try:
        if (body.runs is None) == (body.q is None):
            raise tagging.TaggingError("runs", "name the runs (runs) or a query (q), one of them")
        if body.runs is not None:
            runs = Run.visible_to(request.user).filter(pk__in=body.runs)
            missing = set(body.runs) - set(runs.values_list("pk", flat=True))
            if missing:
                raise tagging.TaggingError(
                    "runs", f"no run {', '.join(map(str, sorted(missing)[:10]))} in your teams"
                )
        else:
            runs = tagging.matching(request.user, body.q)
        return tagging.tag_runs(runs, body.add, body.remove)
    except tagging.TaggingError as exc:
        return _tagging_error(exc)


def _note_out(note) -> dict[str, Any]:
    return {"id": note.pk, "author": note.author.get_username(), "text": note.text, "created": note.created}


def _add_note(request: HttpRequest, text: str, **on) -> Status:
    try:
        return Status(201, _note_out(tagging.add_note(request.user, text, **on)))
    except tagging.TaggingError as exc:
        return _tagging_error(exc)


@router.post("/runs/{run_id}/notes", response=responses({201: NoteOut}, 404, 422))
def note_run(request: HttpRequest, run_id: int, body: NoteIn):
    """Add a note to a run (plain text)."""
    return _add_note(request, body.text, run=_visible_run(request, run_id))


@router.post("/experiments/{experiment_id}/notes", response=responses({201: NoteOut}, 404, 422))
def note_experiment(request: HttpRequest, experiment_id: int, body: NoteIn):
    """Add a note to an experiment (plain text)."""
    return _add_note(request, body.text, experiment=_visible_experiment(request, experiment_id))


@router.delete("/notes/{note_id}", response=responses({200: NoteDeletedOut}, 403, 404, 422))
def delete_note(request: HttpRequest, note_id: int):
    """Delete a note on a run or an experiment: its author, or an admin of its team."""
    note = get_object_or_404(Note.visible_to(request.user), pk=note_id)
    try:
        tagging.delete_note(request.user, note)
    except PermissionDenied as exc:
        raise HttpError(403, str(exc)) from exc
    return {"note": note_id}


@router.post("/experiments/{experiment_id}/tags", response=responses({200: TagsOut}, 404, 422))
def tag_experiment(request: HttpRequest, experiment_id: int, body: TagsIn):
    """Add and remove the experiment's tags (a runs query's `tag = x` matches its runs too)."""
    experiment = _visible_experiment(request, experiment_id)
    try:
        return {"tags": tagging.tag_experiment(experiment, body.add, body.remove)}
    except tagging.TaggingError as exc:
        return _tagging_error(exc)


def _view_out(view: SavedView) -> dict[str, Any]:
    return {
        "id": view.pk,
        "team": view.team_id,
        "name": view.name,
        "query": view.query,
        "author": view.author.get_username(),
        "created": view.created,
    }


@router.get("/views", response=responses({200: ViewsOut}, 422))
def list_views(request: HttpRequest):
    """Your teams' saved views of the runs list (named queries), by name."""
    views = SavedView.visible_to(request.user).select_related("author")
    return {"views": [_view_out(view) for view in views]}


@router.post("/views", response=responses({201: ViewOut}, 404, 422))
def save_view(request: HttpRequest, body: ViewIn):
    """Save a runs query under a name, shared with a team (the same name replaces it)."""
    teams = Team.objects.filter(memberships__user=request.user).order_by("pk")
    team = get_object_or_404(teams, pk=body.team) if body.team is not None else teams.first()
    try:
        return Status(201, _view_out(tagging.save_view(request.user, team, body.name, body.query)))
    except tagging.TaggingError as exc:
        return _tagging_error(exc)


@router.delete("/views/{view_id}", response=responses({200: ViewDeletedOut}, 404, 422))
def delete_view(request: HttpRequest, view_id: int):
    view = get_object_or_404(SavedView.visible_to(request.user), pk=view_id)
    view.delete()
    return {"view": view_id}


@router.get("/runs/{run_id}", response=responses({200: RunDetailOut}, 404, 422))
def get_run(request: HttpRequest, run_id: int):
    return _run_detail_out(_visible_run(request, run_id))


@router.get(
    "/runs/{run_id}/metrics",
    response=responses({200: MetricsOut}, 404, 422),
    openapi_extra={
        "responses": {
            200: {
                "content": {
                    "text/csv": {
                        "schema": {"type": "string", "description": "name,step,value,wall_time,note"}
                    }
                }
            }
        }
    },
)
def get_metrics(request: HttpRequest, run_id: int, format: Literal["json", "csv"] = "json", name: NoNul = ""):
    """Every metric point of the run: JSON `{name: [[step, value], ...]}` or CSV `name,step,value,wall_time,note`.
    Points stored in a damaged chunk are left out, and said so in `damaged` (a CSV row's note)."""
    run = _visible_run(request, run_id)
    if format == "csv":
        response = HttpResponse(metrics_csv(run, name), content_type="text/csv")
        response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-metrics.csv"'
        return response
    damaged: list[series.Damage] = []
    metrics: dict[str, list[list[float | None]]] = {
        metric: [
            [step, series.shown(value)] for step, value in zip(steps.tolist(), values.tolist(), strict=True)
        ]
        for metric, (steps, values, _) in series.points_of(run.pk, name, damaged)
    }
    return {"run": run.pk, "metrics": metrics, "damaged": series.notes_by_metric(damaged)}


@router.post("/runs/{run_id}/cancel", response=responses({200: RunDetailOut}, 404, 409, 422))
def cancel_run(request: HttpRequest, run_id: int):
    """Cancel a queued run now, or a running one at its next step."""
    run = _visible_run(request, run_id)
    if not run.cancel():  # a run deleted meanwhile: Run.DoesNotExist, a 404 (lab.middleware)
        raise HttpError(
            409,
            run.read_only_refusal("cancelled")
            or f"run {run.pk} is {run.status}; only queued or running runs can be cancelled",
        )
    return _run_detail_out(run)


@router.post("/runs/{run_id}/archive", response=responses({200: RunDetailOut}, 404, 409, 422))
def archive_run(request: HttpRequest, run_id: int):
    """Set an ended run aside: kept (and cited by the reports that cite it), but left out of the
    runs list (`archived=1` shows it), comparisons and claims. 409 while it is queued or running."""
    return _set_archived(request, run_id, True)


@router.post("/runs/{run_id}/unarchive", response=responses({200: RunDetailOut}, 404, 409, 422))
def unarchive_run(request: HttpRequest, run_id: int):
    """Bring an archived run back into the lists, comparisons and claims."""
    return _set_archived(request, run_id, False)


def _set_archived(request: HttpRequest, run_id: int, archived: bool):
    run = _visible_run(request, run_id)
    try:
        run.set_archived(archived)
    except ValueError as exc:
        raise HttpError(409, str(exc)) from exc
    return _run_detail_out(run)


@router.post("/runs/{run_id}/retry", response=responses({200: RunDetailOut}, 404, 409, 422))
def retry_run(request: HttpRequest, run_id: int):
    """Queue a new attempt of a failed, cancelled or lost run; it resumes from its last checkpoint
    (also while the message broker is down: then `dispatched_at` is null). 409 when the run has no
    attempts left or its team already has LAB_TEAM_MAX_QUEUED queued runs."""
    run = _visible_run(request, run_id)
    refusal = run.retry_refusal()
    if refusal or not run.retry():  # a run deleted meanwhile: Run.DoesNotExist, a 404 (lab.middleware)
        raise HttpError(409, refusal or run.retry_refusal())
    return _run_detail_out(run)
