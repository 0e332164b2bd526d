"""Pages of experiments and runs: the experiments of your teams, the sweep form, an experiment
with its runs, a run's page, and what can be done to them (the Runs list: `run_list`). Every query goes through
`visible_to(user)`, so another team's objects are 404s. Live parts (`…/live/` fragments) are
re-fetched by the page while something is still queued or running."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import (
    Case,
    Count,
    F,
    Max,
    Min,
    Q,
    Value,
    When,
    Window,
)
from django.db.models.functions import RowNumber
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.defaultfilters import pluralize
from django.views.decorators.http import require_POST

from accounts.models import Team
from execution.messages import NOT_SENT
from experiments import packing, progress, series, sweeps
from experiments.forms import TEMPLATES, SweepForm, TemplateForm, initial_from_spec
from experiments.models import Completion, Experiment, ExperimentNotDeletable, Run, SweepTemplate
from experiments.run_csv import metrics_csv

UNDISPATCHED = NOT_SENT[:1].upper() + NOT_SENT[1:] + "."
RECENT_STEPS = 10
RECENT_COMPLETIONS = 20
# The run page's side-by-side table: this many of the run's latest prompts, this many other runs each.
SAME_PROMPTS = 5
SAME_PROMPT_RUNS = 12
ROLLOUT_JOBS_SHOWN = 50
EXPERIMENTS_PER_PAGE = 25


def paginate(request: HttpRequest, items, per_page: int) -> dict:
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
            **paginate(request, experiments, EXPERIMENTS_PER_PAGE),
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
    duplicate = None
    if request.method == "POST" and form.is_valid() and "preview" not in request.POST:
        data = form.cleaned_data
        if "queue_again" not in request.POST:
            duplicate = sweeps.recent_duplicate(data["team"], request.user, data["name"], form.sweep)
        if duplicate is None:
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
    status = 422 if request.method == "POST" and form.errors else 409 if duplicate else 200
    context = {
        "form": form,
        "duplicate": duplicate,
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
        "sweep": progress.sweep_progress(experiment),
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
def experiment_seeds(request: HttpRequest, experiment_id: int) -> HttpResponse:
    """GET: how many runs adding seeds would queue (`?n=`, e.g. the seeds a claim says would settle
    it), to confirm; POST: queue every cell again with the next n seeds, into this experiment."""
    experiment = _experiment(request, experiment_id)
    data = request.POST if request.method == "POST" else request.GET
    text = data.get("n", "1").strip()
    error = ""
    n = int(text) if text.isdigit() and len(text) <= 3 else 0
    if request.method == "POST":
        try:
            runs = sweeps.add_seeds(experiment, request.user, n)
        except sweeps.SweepError as exc:
            error = "; ".join(message for _, message in exc.errors)
        else:
            added = sorted({run.seed for run in runs})
            messages.success(
                request,
                f"Queued {len(runs)} run{pluralize(len(runs))}: every cell with seed{pluralize(len(added))} "
                f"{', '.join(map(str, added))}.",
            )
            return redirect("experiment-detail", experiment.pk)
    try:
        seeds = sweeps.seeds_to_add(experiment, n)
    except sweeps.SweepError as exc:
        error, seeds = error or exc.errors[0][1], []
    spec = experiment.spec
    # The sweep's cells: an imported run's cell is queued again only if the sweep has it.
    cells = (
        experiment.runs.filter(imported=None)
        .values("preset", "staleness", "variant_pairs")
        .distinct()
        .count()
    )
    context = {
        "experiment": experiment,
        "n": text,
        "seeds": seeds,
        "have": spec.get("seeds", []),
        "cells": cells,
        "runs": cells * len(seeds),
        "error": error,
        "max_seeds": sweeps.MAX_ADDED_SEEDS,
    }
    return render(request, "experiments/seeds.html", context, status=422 if error else 200)


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
def experiment_set_archived(request: HttpRequest, experiment_id: int, archived: bool) -> HttpResponse:
    """Archive the experiment (hide it from the lists, keep it) or bring it back."""
    experiment = _experiment(request, experiment_id)
    if archived:
        experiment.archive()
        messages.success(request, f"Archived {experiment}: hidden from the lists until it is unarchived.")
    else:
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
        except ExperimentNotDeletable as exc:
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
        request,
        "experiments/_runs.html",
        {"experiment": experiment, "sweep": progress.sweep_progress(experiment)},
    )


def _run(request: HttpRequest, run_id: int) -> Run:
    return get_object_or_404(
        Run.visible_to(request.user).select_related("experiment__team", "imported__imported_by"), pk=run_id
    )


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


def _collapse(run: Run):
    """Where the run collapsed, for its page; None when its held-out accuracy is damaged (the
    page names the damaged metric, and its summary still says whether it collapsed)."""
    try:
        return run.collapse() if run.collapsed else None
    except packing.Damaged:
        return None


def _run_context(run: Run) -> dict:
    damaged: list[series.Damage] = []
    steps, table = series.recent(run.pk, RECENT_STEPS, damaged)
    completions = list(run.completions.all()[:RECENT_COMPLETIONS])
    job_counts = run.rollout_job_counts()
    n_jobs = sum(job_counts.values())
    return {
        "run": run,
        "report": progress.run_progress(run),
        "collapse": _collapse(run),
        "job_counts": {status: n for status, n in job_counts.items() if n},
        "n_jobs": n_jobs,
        "rollout_jobs": run.latest_rollout_jobs(ROLLOUT_JOBS_SHOWN) if n_jobs else [],
        "steps": steps,
        "metric_rows": [(name, [table[name].get(s) for s in steps]) for name in sorted(table)],
        "damaged": [d.note() for d in damaged],
        "completions": completions,
        "same_prompts": _same_prompts(run, completions),
    }


@login_required
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run = _run(request, run_id)
    context = {**_run_context(run), "is_admin": run.experiment.team.is_admin(request.user)}
    return render(request, "experiments/run.html", context)


@login_required
def run_live(request: HttpRequest, run_id: int) -> HttpResponse:
    """The run page's live parts: `?part=status` the status at the top, else the details below the curves."""
    run = _run(request, run_id)
    if request.GET.get("part") == "status":
        return render(
            request, "experiments/_run_status.html", {"run": run, "report": progress.run_progress(run)}
        )
    return render(request, "experiments/_run_live.html", _run_context(run))


@login_required
def run_metrics_csv(request: HttpRequest, run_id: int) -> HttpResponse:
    """Every metric point of the run as CSV, for the browser's session (the API's needs a token)."""
    run = _run(request, run_id)
    response = HttpResponse(metrics_csv(run), content_type="text/csv")
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
        refusal = run.read_only_refusal("cancelled") or (
            f"run {run.pk} is {run.status}; only queued or running runs can be cancelled"
        )
        messages.error(request, refusal[:1].upper() + refusal[1:] + ".")
    return redirect("run-detail", run.pk)


@login_required
@require_POST
def run_archive(request: HttpRequest, run_id: int) -> HttpResponse:
    """Archive the run (`unarchive=1`: bring it back)."""
    run = _run(request, run_id)
    archive = request.POST.get("unarchive") != "1"
    try:
        run.set_archived(archive)
    except ValueError as exc:
        messages.error(request, f"Not archived: {exc}.")
        return redirect("run-detail", run.pk)
    if archive:
        messages.success(
            request, f"Archived run {run.pk}: kept, but left out of the lists, comparisons and claims."
        )
    else:
        messages.success(request, f"Unarchived run {run.pk}.")
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
