"""Server-rendered pages: experiments of your teams, the sweep form, runs, teams, and the
comparison dashboard (of an experiment, or of runs picked on the runs page) with its JSON / CSV data,
and the user's API tokens.

Every query goes through `visible_to(user)` or the user's memberships, so another team's
objects are 404s. Live parts (`…/live/` fragments) are re-fetched by the page while
something is still queued or running.
"""

from __future__ import annotations

import itertools
import os
import platform
import re
import typing

import numpy as np
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.exceptions import NON_FIELD_ERRORS
from django.core.paginator import Paginator
from django.db import connection, transaction
from django.db.models import Case, Count, F, Max, Min, Q, Value, When, Window
from django.db.models.functions import RowNumber
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.defaultfilters import pluralize
from django.urls import reverse
from django.views.decorators.http import require_POST
from lab.middleware import RETRY_AFTER_S, DatabaseUnreachable

from experiments import collapse, compare, curves, dispatch, sweeps
from experiments.forms import (
    TEMPLATES,
    InviteForm,
    LoginForm,
    SweepForm,
    TeamForm,
    TemplateForm,
    TokenForm,
    initial_from_spec,
)
from experiments.models import (
    ApiToken,
    Completion,
    Experiment,
    ExperimentActive,
    Invitation,
    Membership,
    MetricPoint,
    Run,
    SweepTemplate,
    Team,
    TooManyTokens,
)
from rlcore.config import ExecutionConfig

UNDISPATCHED = dispatch.NOT_SENT[:1].upper() + dispatch.NOT_SENT[1:] + "."
EXECUTION_MODES = typing.get_args(ExecutionConfig.model_fields["mode"].annotation)
RECENT_STEPS = 10
RECENT_COMPLETIONS = 20
# The run page's side-by-side table: this many of the run's latest prompts, this many other runs each.
SAME_PROMPTS = 5
SAME_PROMPT_RUNS = 12
ROLLOUT_JOBS_SHOWN = 50
EXPERIMENTS_PER_PAGE = 25
RUNS_PER_PAGE = 100


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


class LoginView(auth_views.LoginView):
    """Django's login page; a login refused by the rate limits is a 429 with Retry-After."""

    form_class = LoginForm

    def form_invalid(self, form):
        response = super().form_invalid(form)
        if form.has_error(NON_FIELD_ERRORS, "throttled"):
            response.status_code = 429
            response["Retry-After"] = str(self.request.login_retry_after)
        return response


def _paginate(request: HttpRequest, items, per_page: int) -> dict:
    """Page `?page=` of `items` (an ordered query) for a template: `page`, and `previous_url` and
    `next_url` (the same query string with another page, or None). A page that is not a whole
    number or lies past the last one shows the first or the last page and says so."""
    paginator = Paginator(items, per_page)
    text = request.GET.get("page", "1")
    last = paginator.num_pages
    number = int(text) if text.isdigit() and len(text) <= 18 else None
    if number is None or not 1 <= number <= last:
        shown = 1 if number is None or number < 1 else last
        messages.error(
            request,
            f"page must be a whole number from 1 to {last} (got {text[:50]!r}); showing page {shown}",
        )
        number = shown
    page = paginator.page(number)

    def url(n: int) -> str:
        query = request.GET.copy()
        query["page"] = str(n)
        return "?" + query.urlencode()

    return {
        "page": page,
        "previous_url": url(page.previous_page_number()) if page.has_previous() else None,
        "next_url": url(page.next_page_number()) if page.has_next() else None,
    }


@login_required
def experiment_list(request: HttpRequest) -> HttpResponse:
    """Experiments of the user's teams, newest first, `EXPERIMENTS_PER_PAGE` a page."""
    teams = Team.objects.filter(members=request.user)
    experiments = (
        Experiment.visible_to(request.user)
        .select_related("team", "owner")
        .annotate(
            n_runs=Count("runs"),
            n_active=Count("runs", filter=Q(runs__status__in=Run.ACTIVE)),
            n_succeeded=Count("runs", filter=Q(runs__status=Run.SUCCEEDED)),
            first_started=Min("runs__started"),
            last_finished=Max("runs__finished"),
        )
        .order_by("-created", "-id")  # Meta.ordering does not apply to a query with GROUP BY
    )
    team_id = request.GET.get("team", "")
    if team_id.isdigit():
        experiments = experiments.filter(team_id=int(team_id))
    show_archived = request.GET.get("archived") == "1"
    if not show_archived:
        experiments = experiments.filter(archived=None)
    return render(
        request,
        "experiments/list.html",
        {
            **_paginate(request, experiments, EXPERIMENTS_PER_PAGE),
            "teams": teams,
            "team_id": team_id,
            "show_archived": show_archived,
        },
    )


def _starting_point(request: HttpRequest) -> tuple[dict, list[str], str]:
    """The form's initial values from `?template=` (built in), `?saved=` (a team's template) or
    `?clone=` (an experiment of the user's teams); what of it the form cannot show; where it came
    from ("" for a blank form). Another team's template or experiment is a 404."""
    if name := request.GET.get("template"):
        return dict(TEMPLATES.get(name, {})), [], f"the template {name}" if name in TEMPLATES else ""
    if (saved := request.GET.get("saved", "")).isdigit() and len(saved) <= 18:
        template = get_object_or_404(SweepTemplate.objects.filter(team__members=request.user), pk=int(saved))
        initial, warnings = initial_from_spec(template.spec)
        return (
            {**initial, "name": template.name, "team": template.team_id},
            warnings,
            f"the template {template}",
        )
    if (clone := request.GET.get("clone", "")).isdigit() and len(clone) <= 18:
        experiment = get_object_or_404(Experiment.visible_to(request.user), pk=int(clone))
        initial, warnings = initial_from_spec(experiment.spec)
        initial |= {
            "name": f"{experiment.name} (copy)",
            "team": experiment.team_id,
            "description": experiment.description,
        }
        return initial, warnings, f"experiment #{experiment.pk} {experiment.name}"
    return {}, [], ""


@login_required
def submit_sweep(request: HttpRequest) -> HttpResponse:
    """The sweep form; a user in no team is told to create or join one first."""
    teams = Team.objects.filter(members=request.user)
    if not teams.exists():
        return render(request, "experiments/submit.html", {"no_team": True})
    initial, warnings, source = _starting_point(request) if request.method == "GET" else ({}, [], "")
    form = SweepForm(request.POST or None, user=request.user, initial=initial)
    if request.method == "POST" and form.is_valid() and "preview" not in request.POST:
        data = form.cleaned_data
        try:
            experiment = sweeps.create_experiment(
                data["team"], request.user, data["name"], data["description"], form.sweep
            )
        except sweeps.SweepError as exc:  # the team's queued cap, reached since the form was checked
            form.add_sweep_errors(exc)
        else:
            queued = experiment.runs.count()
            messages.success(request, f"Queued {queued} run{'' if queued == 1 else 's'}.")
            if experiment.runs.filter(dispatched_at=None).exists():
                messages.warning(request, UNDISPATCHED)
            for warning in form.queue_warnings:
                messages.warning(request, warning)
            return redirect("experiment-detail", experiment.pk)
    status = 422 if request.method == "POST" and form.errors else 200
    context = {
        "form": form,
        "source": source,
        "source_warnings": warnings,
        "saved_templates": SweepTemplate.objects.filter(team__in=teams).select_related("team"),
    }
    return render(request, "experiments/submit.html", context, status=status)


def _experiment(request: HttpRequest, experiment_id: int) -> Experiment:
    return get_object_or_404(
        Experiment.visible_to(request.user).select_related("team", "owner"), pk=experiment_id
    )


@login_required
def experiment_detail(request: HttpRequest, experiment_id: int) -> HttpResponse:
    experiment = _experiment(request, experiment_id)
    context = {
        "experiment": experiment,
        "sweep": experiment.progress_report(),
        "is_admin": experiment.team.is_admin(request.user),
        "template_form": TemplateForm(initial={"name": experiment.name}),
    }
    return render(request, "experiments/detail.html", context)


@login_required
def experiment_save_template(request: HttpRequest, experiment_id: int) -> HttpResponse:
    """POST: save the experiment's sweep as a template of its team, under a name the team has not used."""
    experiment = _experiment(request, experiment_id)
    if request.method != "POST":
        return redirect("experiment-detail", experiment.pk)
    form = TemplateForm(request.POST)
    if not form.is_valid():
        messages.error(
            request, "Not saved: " + "; ".join(e for errors in form.errors.values() for e in errors)
        )
    else:
        name = form.cleaned_data["name"]
        _, created = SweepTemplate.objects.get_or_create(
            team=experiment.team, name=name, defaults={"spec": experiment.spec, "created_by": request.user}
        )
        if created:
            messages.success(
                request, f"Saved as the template {name!r} of {experiment.team}: New sweep starts from it."
            )
        else:
            messages.error(request, f"Not saved: {experiment.team} has a template called {name!r} already.")
    return redirect("experiment-detail", experiment.pk)


@login_required
def experiment_cancel(request: HttpRequest, experiment_id: int) -> HttpResponse:
    """GET: what cancelling would stop, to confirm; POST: cancel every queued or running run."""
    experiment = _experiment(request, experiment_id)
    if request.method != "POST":
        active = experiment.runs.filter(status__in=Run.ACTIVE)
        return render(
            request,
            "experiments/cancel.html",
            {
                "experiment": experiment,
                "queued": active.filter(status=Run.QUEUED).count(),
                "running": active.filter(status=Run.RUNNING).count(),
            },
        )
    cancelled = experiment.cancel()
    if cancelled:
        messages.success(
            request,
            f"Cancelled {cancelled} run{pluralize(cancelled)}: queued ones at once, running ones "
            "after their current step.",
        )
    else:
        messages.error(request, "No run of this experiment is queued or running; nothing to cancel.")
    return redirect("experiment-detail", experiment.pk)


@login_required
@require_POST
def experiment_archive(request: HttpRequest, experiment_id: int) -> HttpResponse:
    experiment = _experiment(request, experiment_id)
    experiment.archive()
    messages.success(request, f"Archived {experiment}: hidden from the lists until it is unarchived.")
    return redirect("experiment-detail", experiment.pk)


@login_required
@require_POST
def experiment_unarchive(request: HttpRequest, experiment_id: int) -> HttpResponse:
    experiment = _experiment(request, experiment_id)
    experiment.unarchive()
    messages.success(request, f"Unarchived {experiment}: it is in the lists again.")
    return redirect("experiment-detail", experiment.pk)


@login_required
def experiment_delete(request: HttpRequest, experiment_id: int) -> HttpResponse:
    """GET: what deleting the experiment would delete; POST: delete it. Team admins only."""
    experiment = _experiment(request, experiment_id)
    if not experiment.team.is_admin(request.user):
        messages.error(
            request, f"Only admins of {experiment.team} can delete its experiments; ask one of them."
        )
        return redirect("experiment-detail", experiment.pk)
    if request.method == "POST":
        try:
            experiment.delete_with_files()
        except ExperimentActive as exc:
            messages.error(request, f"Not deleted: {exc}.")
            return redirect("experiment-delete", experiment.pk)
        messages.success(request, f"Deleted {experiment} and its runs.")
        return redirect("experiment-list")
    return render(
        request,
        "experiments/delete.html",
        {
            "experiment": experiment,
            "report": experiment.deletion_report(),
            "active": experiment.runs.filter(status__in=Run.ACTIVE).count(),
        },
    )


@login_required
def experiment_runs_live(request: HttpRequest, experiment_id: int) -> HttpResponse:
    experiment = _experiment(request, experiment_id)
    return render(
        request, "experiments/_runs.html", {"experiment": experiment, "sweep": experiment.progress_report()}
    )


def _compare_page(request: HttpRequest, context: dict) -> HttpResponse:
    """The dashboard page; its script draws everything from the data URLs in `context`."""
    return render(
        request,
        "experiments/compare.html",
        {
            **context,
            "metrics": compare.METRICS,
            "x_axes": curves.X_AXES,
            "bands": curves.BANDS,
            "rules": curves.RULES,
            "min_ci_seeds": curves.MIN_CI_SEEDS,
            "collapse_rule": {
                "fraction": collapse.NEAR_ZERO_FRACTION,
                "min_best": collapse.MIN_BEST,
                "min_evals": collapse.MIN_EVALS,
            },
        },
    )


def _bad_query(exc: compare.QueryError) -> JsonResponse:
    return JsonResponse({"detail": [{"param": exc.param, "msg": exc.message}]}, status=400)


def _comparison(request: HttpRequest, runs, table: str, name: str) -> HttpResponse:
    """`compare` of `runs` for the query string: JSON, or with `format=csv` the curves or summary
    table as a CSV file whose name starts with `name`."""
    try:
        query = compare.ComparisonQuery.parse(request.GET)
        output = request.GET.get("format", "json")
        if output not in ("json", "csv"):
            raise compare.QueryError("format", f"format must be json or csv (got {output!r})")
    except compare.QueryError as exc:
        return _bad_query(exc)
    payload = compare.compare(runs, query)
    if output == "json":
        summary = {"summary": payload["summary"], "throughput": payload["throughput"]}
        return JsonResponse(payload if table == "curves" else summary)
    text = compare.curves_csv(payload) if table == "curves" else compare.summary_csv(payload)
    response = HttpResponse(text, content_type="text/csv")
    metric = re.sub(r"[^A-Za-z0-9_.-]+", "-", query.metric).strip("-")
    response["Content-Disposition"] = (
        f'attachment; filename="{name}-{metric}-{query.x if table == "curves" else query.rule}-{table}.csv"'
    )
    return response


@login_required
def experiment_compare(request: HttpRequest, experiment_id: int) -> HttpResponse:
    experiment = _experiment(request, experiment_id)
    return _compare_page(
        request,
        {
            "experiment": experiment,
            "data_url": reverse("experiment-compare-data", args=[experiment.pk]),
            "summary_url": reverse("experiment-compare-summary", args=[experiment.pk]),
        },
    )


@login_required
def experiment_compare_data(request: HttpRequest, experiment_id: int) -> HttpResponse:
    """Aggregated curves, summary and per-run final values as JSON; `format=csv` gives the curves."""
    experiment = _experiment(request, experiment_id)
    return _comparison(request, experiment.runs.all(), "curves", f"experiment-{experiment.pk}")


@login_required
def experiment_compare_summary(request: HttpRequest, experiment_id: int) -> HttpResponse:
    """The summary table (final value ± CI and throughput per preset × staleness) as JSON or, with
    `format=csv`, CSV."""
    experiment = _experiment(request, experiment_id)
    return _comparison(request, experiment.runs.all(), "summary", f"experiment-{experiment.pk}")


def _selected_runs(request: HttpRequest):
    """The runs picked in `?runs=…`, all of them in the user's teams (else a QueryError)."""
    return compare.selected_runs(Run.visible_to(request.user), compare.parse_run_ids(request.GET))


@login_required
def runs_compare(request: HttpRequest) -> HttpResponse:
    """Any runs of the user's teams, picked on the runs page, on one dashboard. A link naming runs
    the user cannot see (a permalink from another team's member) shows the ones they can, saying
    how many were left out, and never which of those exist."""
    try:
        wanted = compare.parse_run_ids(request.GET)
    except compare.QueryError as exc:
        messages.error(request, exc.message)
        return redirect("run-list")
    runs = Run.visible_to(request.user).filter(pk__in=wanted)
    shown = list(runs.order_by("pk").values_list("pk", flat=True))
    if not shown:
        messages.error(request, "None of the linked runs is in your teams (or they no longer exist).")
        return redirect("run-list")
    left_out = len(wanted) - len(shown)
    if left_out:
        messages.warning(
            request,
            f"{left_out} of the {len(wanted)} linked runs {'is' if left_out == 1 else 'are'} not in your teams "
            "or no longer exist, and left out: the dashboard shows the others.",
        )
    ids = ",".join(map(str, shown))
    return _compare_page(
        request,
        {
            "selected": ids,
            "n_selected": len(shown),
            "experiments": Experiment.objects.filter(runs__in=runs).distinct().order_by("pk"),
            "data_url": reverse("runs-compare-data"),
            "summary_url": reverse("runs-compare-summary"),
        },
    )


def _selection_comparison(request: HttpRequest, table: str) -> HttpResponse:
    try:
        runs = _selected_runs(request)
    except compare.QueryError as exc:
        return _bad_query(exc)
    return _comparison(request, runs, table, "runs")


@login_required
def runs_compare_data(request: HttpRequest) -> HttpResponse:
    """`experiment_compare_data` for the runs in `?runs=…`."""
    return _selection_comparison(request, "curves")


@login_required
def runs_compare_summary(request: HttpRequest) -> HttpResponse:
    """`experiment_compare_summary` for the runs in `?runs=…`."""
    return _selection_comparison(request, "summary")


@login_required
def run_list(request: HttpRequest) -> HttpResponse:
    """Runs of the user's teams, newest first, `RUNS_PER_PAGE` a page, filtered by team, experiment,
    preset, staleness or status, with check boxes to compare any of them."""
    runs = Run.visible_to(request.user).select_related("experiment__team").order_by("-pk")
    filters = {
        "team": "experiment__team_id",
        "experiment": "experiment_id",
        "preset": "preset",
        "staleness": "staleness",
        "status": "status",
    }
    show_archived = request.GET.get("archived") == "1"
    experiments = Experiment.visible_to(request.user).order_by("-pk")
    if not show_archived:
        runs = runs.filter(experiment__archived=None)
        experiments = experiments.filter(archived=None)
    chosen = {name: request.GET.get(name, "").strip() for name in (*filters, "mode")}
    for name, value in chosen.items():
        if not value:
            continue
        if name == "mode":
            if value not in EXECUTION_MODES:
                messages.error(
                    request,
                    f"mode must be one of {', '.join(EXECUTION_MODES)} (got {value[:50]!r}); not filtered",
                )
            else:
                runs = runs.filter(_mode_filter(value))
            continue
        if name in ("team", "experiment") and not (value.isdigit() and len(value) <= 18):
            article = "an" if name == "experiment" else "a"
            messages.error(
                request, f"{name} must be the id of {article} {name} (got {value[:50]!r}); not filtered"
            )
        elif len(value) > 100 or "\x00" in value:
            messages.error(request, f"{name} must be at most 100 characters, without NUL; not filtered")
        else:
            runs = runs.filter(**{filters[name]: value})
    visible = Run.visible_to(request.user)
    return render(
        request,
        "experiments/runs.html",
        {
            **_paginate(request, runs, RUNS_PER_PAGE),
            "chosen": chosen,
            "teams": Team.objects.filter(members=request.user),
            "experiments": experiments[:200],
            "show_archived": show_archived,
            "presets": sorted(
                visible.order_by().values_list("preset", flat=True).distinct(), key=compare.preset_sort_key
            ),
            "staleness": sorted(visible.order_by().values_list("staleness", flat=True).distinct()),
            "statuses": [s for s, _ in Run.STATUSES],
            "modes": EXECUTION_MODES,
        },
    )


def _mode_filter(mode: str) -> Q:
    """Runs of execution mode `mode` (runs stored before execution modes existed were simulated)."""
    if mode == "simulated":
        return (
            Q(config__execution__mode="simulated")
            | Q(config__execution__isnull=True)
            | Q(config__execution__mode__isnull=True)
        )
    return Q(config__execution__mode=mode)


def _run(request: HttpRequest, run_id: int) -> Run:
    return get_object_or_404(Run.visible_to(request.user).select_related("experiment__team"), pk=run_id)


def _same_prompts(run: Run, completions: list[Completion]) -> list[dict]:
    """The latest `SAME_PROMPTS` prompts of `completions` (newest first), each with this run's completion
    and those of up to `SAME_PROMPT_RUNS` other runs of the experiment that got the same prompt.

    Runs of the same seed see the same prompts at the same step, so another run's completion at this
    run's step is preferred, else its latest one. One query: the database keeps one row per prompt and run.
    """
    mine: dict[str, Completion] = {}
    for c in completions:
        mine.setdefault(c.prompt, c)
        if len(mine) == SAME_PROMPTS:
            break
    if not mine:
        return []
    at_my_step = Case(
        *(When(prompt=prompt, step=c.step, then=Value(0)) for prompt, c in mine.items()), default=Value(1)
    )
    others = (
        Completion.objects.filter(run__experiment_id=run.experiment_id, prompt__in=list(mine))
        .exclude(run_id=run.pk)
        .annotate(
            preference=Window(
                RowNumber(),
                partition_by=[F("prompt"), F("run_id")],
                order_by=[at_my_step.asc(), F("step").desc(), F("id").asc()],
            )
        )
        .filter(preference=1)
        .order_by()
        .select_related("run")
        .only("run", "step", "prompt", "completion", "reward", "run__preset", "run__staleness", "run__seed")
    )
    rows: dict[str, list[Completion]] = {prompt: [] for prompt in mine}
    for c in others:
        rows[c.prompt].append(c)
    groups = []
    for prompt, c in mine.items():
        # Runs at this run's step first, then in run order; shown in run order.
        kept = sorted(rows[prompt], key=lambda o, step=c.step: (o.step != step, o.run_id))[:SAME_PROMPT_RUNS]
        if kept:
            groups.append({"prompt": prompt, "rows": [c, *sorted(kept, key=lambda o: o.run_id)]})
    return groups


def _run_context(run: Run) -> dict:
    recent_steps = list(
        MetricPoint.objects.filter(run=run)
        .values_list("step", flat=True)
        .distinct()
        .order_by("-step")[:RECENT_STEPS]
    )
    table: dict[str, dict[int, float | None]] = {}
    for name, step, value in MetricPoint.objects.filter(run=run, step__in=recent_steps).values_list(
        "name", "step", "value"
    ):
        table.setdefault(name, {})[step] = value
    steps = sorted(recent_steps)
    completions = list(run.completions.all()[:RECENT_COMPLETIONS])
    job_counts = run.rollout_job_counts()
    n_jobs = sum(job_counts.values())
    return {
        "run": run,
        "report": run.progress_report(),
        "collapse": run.collapse() if run.collapsed else None,
        "job_counts": {status: n for status, n in job_counts.items() if n},
        "n_jobs": n_jobs,
        "rollout_jobs": run.latest_rollout_jobs(ROLLOUT_JOBS_SHOWN) if n_jobs else [],
        "steps": steps,
        "metric_rows": [(name, [table[name].get(s) for s in steps]) for name in sorted(table)],
        "completions": completions,
        "same_prompts": _same_prompts(run, completions),
    }


@login_required
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    return render(request, "experiments/run.html", _run_context(_run(request, run_id)))


@login_required
def run_live(request: HttpRequest, run_id: int) -> HttpResponse:
    """The run page's live parts: `?part=status` the status at the top, else the details below the curves."""
    run = _run(request, run_id)
    if request.GET.get("part") == "status":
        return render(request, "experiments/_run_status.html", {"run": run, "report": run.progress_report()})
    return render(request, "experiments/_run_live.html", _run_context(run))


@login_required
def run_curves(request: HttpRequest, run_id: int) -> JsonResponse:
    """Every metric the run logged as `{name: {"x": steps, "y": values}}`, each downsampled to at most
    `curves.MAX_BUCKETS` buckets (min, max and last of each, so spikes survive); missing values are null."""
    run = _run(request, run_id)
    points = list(
        MetricPoint.objects.filter(run=run).order_by("name", "step").values_list("name", "step", "value")
    )
    x = np.array([step for _, step, _ in points], dtype=float)
    y = np.array([value for _, _, value in points], dtype=float)  # None becomes NaN, then null in the JSON
    metrics = {}
    start = 0
    for name, group in itertools.groupby(name for name, _, _ in points):
        end = start + sum(1 for _ in group)
        keep = start + curves.downsample_index(y[start:end])
        metrics[name] = {"x": compare.json_numbers(x[keep]), "y": compare.json_numbers(y[keep])}
        start = end
    return JsonResponse({"run": run.pk, "active": run.is_active, "metrics": metrics})


@login_required
def run_metrics_csv(request: HttpRequest, run_id: int) -> HttpResponse:
    """Every metric point of the run as CSV, for the browser's session (the API's needs a token)."""
    run = _run(request, run_id)
    response = HttpResponse(run.metrics_csv(), content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-metrics.csv"'
    return response


@login_required
@require_POST
def run_cancel(request: HttpRequest, run_id: int) -> HttpResponse:
    run = _run(request, run_id)
    if run.cancel():
        messages.success(
            request,
            f"Run {run.pk} cancelled."
            if run.status == Run.CANCELLED
            else f"Run {run.pk} will stop after its current step.",
        )
    else:
        messages.error(
            request, f"Run {run.pk} is {run.status}; only queued or running runs can be cancelled."
        )
    return redirect("run-detail", run.pk)


@login_required
@require_POST
def run_retry(request: HttpRequest, run_id: int) -> HttpResponse:
    run = _run(request, run_id)
    refusal = run.retry_refusal()
    if not refusal and run.retry():
        messages.success(request, f"Run {run.pk} queued again as attempt {run.attempt}.")
        if run.dispatched_at is None:
            messages.warning(request, UNDISPATCHED)
    else:
        refusal = refusal or run.retry_refusal()
        messages.error(request, refusal[:1].upper() + refusal[1:] + ".")
    return redirect("run-detail", run.pk)


@login_required
def team_list(request: HttpRequest) -> HttpResponse:
    """The user's teams and the invitations waiting for them; POST creates a team, whose admin
    its creator is."""
    form = TeamForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        with transaction.atomic():
            team = form.save()
            Membership.objects.create(team=team, user=request.user, is_admin=True)
        return redirect("team-detail", team.pk)
    teams = Team.objects.filter(members=request.user).annotate(n_members=Count("memberships"))
    invitations = request.user.team_invitations.select_related("team", "invited_by").order_by("created")
    return render(
        request, "experiments/teams.html", {"teams": teams, "form": form, "invitations": invitations}
    )


def _team(request: HttpRequest, team_id: int) -> Team:
    return get_object_or_404(Team.objects.filter(members=request.user), pk=team_id)


@login_required
def team_detail(request: HttpRequest, team_id: int) -> HttpResponse:
    """A team's members; its admins invite users by username (POST). The answer is the same
    whether or not such an account exists, and superusers are never invited."""
    team = _team(request, team_id)
    is_admin = team.is_admin(request.user)
    form = InviteForm(request.POST or None)
    if request.method == "POST":
        if not is_admin:
            messages.error(request, "Only team admins can invite members; ask one of them.")
            return redirect("team-detail", team.pk)
        if form.is_valid():
            username = form.cleaned_data["username"]
            Invitation.invite(team, username, request.user, form.cleaned_data["is_admin"])
            messages.success(
                request,
                f"If {username!r} is an account that can join {team}, it now has an invitation; "
                "it becomes a member when its owner accepts it under Teams.",
            )
            return redirect("team-detail", team.pk)
    memberships = team.memberships.select_related("user").order_by("user__username")
    invitations = (
        team.invitations.select_related("user", "invited_by").order_by("created") if is_admin else []
    )
    return render(
        request,
        "experiments/team.html",
        {
            "team": team,
            "memberships": memberships,
            "is_admin": is_admin,
            "form": form,
            "invitations": invitations,
        },
    )


@login_required
@require_POST
def invitation_revoke(request: HttpRequest, team_id: int, invitation_id: int) -> HttpResponse:
    """A team admin withdraws an invitation not accepted yet (a typo, a change of mind)."""
    team = _team(request, team_id)
    invitation = get_object_or_404(team.invitations.select_related("user"), pk=invitation_id)
    if not team.is_admin(request.user):
        messages.error(request, "Only team admins can revoke invitations; ask one of them.")
    else:
        invitation.delete()
        messages.success(request, f"Revoked the invitation of {invitation.user} to {team}.")
    return redirect("team-detail", team.pk)


@login_required
@require_POST
def invitation_accept(request: HttpRequest, invitation_id: int) -> HttpResponse:
    invitation = get_object_or_404(request.user.team_invitations.select_related("team"), pk=invitation_id)
    membership = invitation.accept()
    messages.success(request, f"You joined {membership.team}{' as an admin' if membership.is_admin else ''}.")
    return redirect("team-detail", membership.team_id)


@login_required
@require_POST
def invitation_decline(request: HttpRequest, invitation_id: int) -> HttpResponse:
    invitation = get_object_or_404(request.user.team_invitations.select_related("team"), pk=invitation_id)
    invitation.delete()
    messages.success(request, f"Declined the invitation to {invitation.team}.")
    return redirect("team-list")


@login_required
@require_POST
def team_remove_member(request: HttpRequest, team_id: int, membership_id: int) -> HttpResponse:
    team = _team(request, team_id)
    membership = get_object_or_404(team.memberships, pk=membership_id)
    if not team.is_admin(request.user):
        messages.error(request, "Only team admins can remove members; ask one of them.")
    elif membership.is_admin and team.memberships.filter(is_admin=True).count() == 1:
        messages.error(request, "A team needs at least one admin; make someone else admin first.")
    else:
        with transaction.atomic():
            # Under the team's row lock, which a sweep holds while it queues runs (sweeps.create_experiment):
            # once this answers, no sweep of the removed member is queued any more.
            Team.objects.select_for_update().filter(pk=team.pk).first()
            membership.delete()
        messages.success(request, f"Removed {membership.user} from {team}.")
    return redirect("team-detail", team.pk)


NEW_TOKEN_SESSION_KEY = "new_api_token"


@login_required
def api_tokens(request: HttpRequest) -> HttpResponse:
    """The user's API tokens. POST makes a named one and redirects here (post/redirect/get: a
    reload makes no second token); the new token is shown once, on that next page, and then only
    its digest is kept."""
    form = TokenForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        name = form.cleaned_data["name"]
        try:
            request.session[NEW_TOKEN_SESSION_KEY] = {
                "name": name,
                "token": ApiToken.issue(request.user, name),
            }
        except TooManyTokens as exc:
            messages.error(request, f"No token made: {exc}.")
        return redirect("api-tokens")
    new_token = request.session.pop(NEW_TOKEN_SESSION_KEY, None)
    tokens = request.user.api_tokens.order_by("-created")
    status = 422 if form.errors else 200
    return render(
        request,
        "experiments/tokens.html",
        {"tokens": tokens, "new_token": new_token, "form": form},
        status=status,
    )


@login_required
@require_POST
def api_token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    token = get_object_or_404(request.user.api_tokens, pk=token_id)
    token.delete()
    messages.success(
        request, f"Revoked token {token.name or token.digest[:8] + '…'}; the API refuses it from now on."
    )
    return redirect("api-tokens")
