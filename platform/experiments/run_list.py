"""The Runs page: runs of the user's teams, filtered by the menus and by a runs query (`q`, see
`experiments.runquery`; a mistake is shown under the box with a caret at its position), a page at
a time; tick any to compare them or tag them, or tag every run the filters match; the team's saved
views restore a query. Also the notes and tags forms of a run's and an experiment's pages."""

from __future__ import annotations

import typing

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import Case, DurationField, ExpressionWrapper, F, Q, QuerySet, When
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from accounts.models import Team
from experiments import series, tagging
from experiments.models import Experiment, Note, Run, SavedView
from experiments.views import paginate
from rlcore.config import ExecutionConfig
from rlcore.presets import preset_sort_key

EXECUTION_MODES = typing.get_args(ExecutionConfig.model_fields["mode"].annotation)
MODES = (*EXECUTION_MODES, "imported")  # the Mode column: how a run ran, or that it was imported
RUNS_PER_PAGE = 100
FILTERS = {
    "team": "experiment__team_id",
    "experiment": "experiment_id",
    "preset": "preset",
    "staleness": "staleness",
    "status": "status",
}
RUN_ORDERS = {
    "newest": ("-pk",),
    "oldest": ("pk",),
    "longest": (F("took").desc(nulls_last=True), "-pk"),
    "shortest": (F("took").asc(nulls_last=True), "-pk"),
    # last(eval/accuracy), from each run's summary row of it: never its points.
    "accurate": (F("last_accuracy").desc(nulls_last=True), "-pk"),
    "least-accurate": (F("last_accuracy").asc(nulls_last=True), "-pk"),
}
ACCURACY_METRIC = "eval/accuracy"


def _took():
    """How long a run took, or has been running so far (null when neither: not started, or queued
    again for a retry), as `Run.duration_s` says."""
    running = Q(status=Run.RUNNING, finished=None)
    return Case(
        When(running, then=ExpressionWrapper(Now() - F("started"), output_field=DurationField())),
        When(
            ~running,
            finished__isnull=False,
            then=ExpressionWrapper(F("finished") - F("started"), output_field=DurationField()),
        ),
        default=None,
        output_field=DurationField(),
    )


def _mode_filter(mode: str) -> Q:
    """Runs the Mode column shows as `mode`: "imported" for imported runs, else the lab's own runs
    whose resolved config has execution mode `mode` (runs from before the execution section
    existed are simulated)."""
    if mode == "imported":
        return Q(imported__isnull=False)
    own = Q(imported__isnull=True)
    if mode == "simulated":
        return own & (Q(config__execution__mode="simulated") | Q(config__execution__isnull=True))
    return own & Q(config__execution__mode=mode)


def filtered(user, params: QueryDict) -> tuple[QuerySet[Run], dict[str, str], list[str], dict | None]:
    """The user's runs that the Runs page's filters `params` keep, the filters chosen, what was
    wrong with any (each left out), and the query's mistake (`text`, `position`, `message`)."""
    runs = Run.visible_to(user).select_related("experiment__team", "imported")
    errors: list[str] = []
    if params.get("archived") != "1":
        runs = runs.filter(experiment__archived=None, archived=None)
    chosen = {name: params.get(name, "").strip() for name in (*FILTERS, "mode")}
    for name, value in chosen.items():
        if not value:
            continue
        if name == "mode":
            if value not in MODES:
                errors.append(f"mode must be one of {', '.join(MODES)} (got {value[:50]!r}); not filtered")
            else:
                runs = runs.filter(_mode_filter(value))
        elif name in ("team", "experiment") and not (value.isdigit() and len(value) <= 18):
            article = "an" if name == "experiment" else "a"
            errors.append(f"{name} must be the id of {article} {name} (got {value[:50]!r}); not filtered")
        elif len(value) > 100 or "\x00" in value:
            errors.append(f"{name} must be at most 100 characters, without NUL; not filtered")
        else:
            runs = runs.filter(**{FILTERS[name]: value})
    text = params.get("q", "")
    chosen["q"] = text
    mistake = None
    if text.strip():
        try:
            runs = tagging.matching(user, text, runs)
        except tagging.TaggingError as exc:
            position = min(exc.position or 0, len(text))
            mistake = {
                "text": text,
                "position": position,
                "caret": " " * position + "^",
                "message": exc.message,
            }
            errors.append(f"q {exc.message}; not filtered by the query")
    return runs, chosen, errors, mistake


@login_required
def run_list(request: HttpRequest) -> HttpResponse:
    """Runs of the user's teams, newest first, `RUNS_PER_PAGE` a page, filtered by team, experiment,
    preset, staleness, status, mode and a runs query, with check boxes to compare or tag them."""
    runs, chosen, errors, mistake = filtered(request.user, request.GET)
    for error in errors:
        messages.error(request, error)
    sort = request.GET.get("sort", "newest")
    if sort not in RUN_ORDERS:
        messages.error(
            request, f"sort must be one of {', '.join(RUN_ORDERS)} (got {sort[:50]!r}); newest first"
        )
        sort = "newest"
    if "accurate" in sort:
        runs = runs.annotate(last_accuracy=series.summary("last_finite", ACCURACY_METRIC))
    runs = (
        runs.annotate(took=_took()).order_by(*RUN_ORDERS[sort]).prefetch_related("tags", "experiment__tags")
    )
    show_archived = request.GET.get("archived") == "1"
    experiments = Experiment.visible_to(request.user).order_by("-pk")
    if not show_archived:
        experiments = experiments.filter(archived=None)
    visible = Run.visible_to(request.user)
    filters = request.GET.copy()
    filters.pop("page", None)
    return render(
        request,
        "experiments/runs.html",
        {
            **paginate(request, runs, RUNS_PER_PAGE),
            "chosen": chosen,
            "query_mistake": mistake,
            "filters": filters.urlencode(),
            "teams": Team.objects.filter(members=request.user),
            "experiments": experiments[:200],
            "show_archived": show_archived,
            "presets": sorted(
                visible.order_by().values_list("preset", flat=True).distinct(), key=preset_sort_key
            ),
            "staleness": sorted(visible.order_by().values_list("staleness", flat=True).distinct()),
            "statuses": [s for s, _ in Run.STATUSES],
            "modes": MODES,
            "sort": sort,
            "orders": RUN_ORDERS,
            "views": SavedView.visible_to(request.user).select_related("team", "author"),
        },
    )


def _back(filters: str) -> HttpResponse:
    return redirect(f"{reverse('run-list')}?{filters}" if filters else reverse("run-list"))


@login_required
@require_POST
def runs_tag(request: HttpRequest) -> HttpResponse:
    """Tag the runs ticked (`runs`), or with `which=matching` every run the page's filters
    (`filters`, the page's query string) keep; `add` and `remove` hold tags separated by spaces or
    commas."""
    filters = request.POST.get("filters", "")
    add, remove = _split(request.POST.get("add", "")), _split(request.POST.get("remove", ""))
    if request.POST.get("which") == "matching":
        runs, _, errors, mistake = filtered(request.user, QueryDict(filters))
        if mistake or errors:
            messages.error(request, "The filters have a mistake: fix it before tagging every run they match.")
            return _back(filters)
    else:
        ids = [int(i) for i in request.POST.getlist("runs") if i.isdigit() and len(i) <= 18]
        if not ids:
            messages.error(request, "Tick the runs to tag, or choose every run the filters match.")
            return _back(filters)
        runs = Run.visible_to(request.user).filter(pk__in=ids)
    try:
        done = tagging.tag_runs(runs, add, remove)
    except tagging.TaggingError as exc:
        messages.error(request, f"{exc.field}: {exc.message}")
        return _back(filters)
    messages.success(
        request,
        f"Tagged {done['runs']} run{'s' if done['runs'] != 1 else ''}: {done['added']} tags added, "
        f"{done['removed']} removed.",
    )
    return _back(filters)


@login_required
@require_POST
def view_save(request: HttpRequest) -> HttpResponse:
    """Save the page's query (`q`) as a view of the team `team`, named `name`."""
    q = request.POST.get("q", "")
    team = get_object_or_404(Team.objects.filter(members=request.user), pk=request.POST.get("team") or 0)
    try:
        view = tagging.save_view(request.user, team, request.POST.get("name", ""), q)
    except tagging.TaggingError as exc:
        messages.error(request, f"{exc.field}: {exc.message}")
        return _back(f"q={_quote(q)}" if q else "")
    messages.success(request, f"Saved the view {view.name!r} for {team}.")
    return redirect(f"{reverse('run-list')}?view={view.pk}&q={_quote(view.query)}")


def _quote(text: str) -> str:
    query = QueryDict(mutable=True)
    query["q"] = text
    return query.urlencode()[2:]


@login_required
@require_POST
def view_delete(request: HttpRequest, view_id: int) -> HttpResponse:
    view = get_object_or_404(SavedView.visible_to(request.user), pk=view_id)
    view.delete()
    messages.success(request, f"Deleted the view {view.name!r}.")
    return redirect("run-list")


def _split(text: str) -> list[str]:
    return [t for t in text.replace(",", " ").split() if t]


@login_required
@require_POST
def note_add(
    request: HttpRequest, run_id: int | None = None, experiment_id: int | None = None
) -> HttpResponse:
    """Add a note to a run or an experiment (from its page)."""
    run = get_object_or_404(Run.visible_to(request.user), pk=run_id) if run_id is not None else None
    experiment = (
        get_object_or_404(Experiment.visible_to(request.user), pk=experiment_id)
        if experiment_id is not None
        else None
    )
    try:
        tagging.add_note(request.user, request.POST.get("text", ""), run=run, experiment=experiment)
    except tagging.TaggingError as exc:
        messages.error(request, f"{exc.field}: {exc.message}")
    return redirect("run-detail", run.pk) if run else redirect("experiment-detail", experiment.pk)


@login_required
@require_POST
def note_delete(request: HttpRequest, note_id: int) -> HttpResponse:
    """Delete a note (from its run's or experiment's page): its author, or an admin of its team."""
    note = get_object_or_404(Note.visible_to(request.user), pk=note_id)
    try:
        tagging.delete_note(request.user, note)
    except PermissionDenied as exc:
        messages.error(request, f"Not deleted: {exc}.")
    else:
        messages.success(request, f"Deleted {note.author}'s note.")
    page = ("run-detail", note.run_id) if note.run_id else ("experiment-detail", note.experiment_id)
    return redirect(*page)


@login_required
@require_POST
def tags_change(
    request: HttpRequest, run_id: int | None = None, experiment_id: int | None = None
) -> HttpResponse:
    """Add and remove tags of a run or an experiment (from its page)."""
    add, remove = _split(request.POST.get("add", "")), _split(request.POST.get("remove", ""))
    try:
        if run_id is not None:
            run = get_object_or_404(Run.visible_to(request.user), pk=run_id)
            tagging.tag_runs(Run.objects.filter(pk=run.pk), add, remove)
            return redirect("run-detail", run.pk)
        experiment = get_object_or_404(Experiment.visible_to(request.user), pk=experiment_id)
        tagging.tag_experiment(experiment, add, remove)
    except tagging.TaggingError as exc:
        messages.error(request, f"{exc.field}: {exc.message}")
        return (
            redirect("run-detail", run_id)
            if run_id is not None
            else redirect("experiment-detail", experiment_id)
        )
    return redirect("experiment-detail", experiment.pk)
