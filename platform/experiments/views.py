"""Server-rendered pages: experiments of your teams, the sweep form, runs, teams, and an
experiment's comparison dashboard with its JSON / CSV data.

Every query goes through `visible_to(user)` or the user's memberships, so another team's
objects are 404s. Live parts (`…/live/` fragments) are re-fetched by the page while
something is still queued or running.
"""

from __future__ import annotations

import platform
import re

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import IntegrityError, transaction
from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from experiments import compare, curves, sweeps
from experiments.forms import AddMemberForm, SweepForm, TeamForm
from experiments.models import Experiment, Membership, MetricPoint, Run, Team

RECENT_STEPS = 10
RECENT_COMPLETIONS = 20


def health(request: HttpRequest) -> JsonResponse:
    """Liveness for load balancers and tests; also shows the stdlib `platform` module works here."""
    return JsonResponse({"status": "ok", "system": platform.system(), "python": platform.python_version()})


@login_required
def experiment_list(request: HttpRequest) -> HttpResponse:
    teams = Team.objects.filter(members=request.user)
    experiments = (
        Experiment.visible_to(request.user)
        .select_related("team", "owner")
        .annotate(
            n_runs=Count("runs"),
            n_active=Count("runs", filter=Q(runs__status__in=Run.ACTIVE)),
            n_succeeded=Count("runs", filter=Q(runs__status=Run.SUCCEEDED)),
        )
    )
    team_id = request.GET.get("team", "")
    if team_id.isdigit():
        experiments = experiments.filter(team_id=int(team_id))
    return render(
        request, "experiments/list.html", {"experiments": experiments, "teams": teams, "team_id": team_id}
    )


@login_required
def submit_sweep(request: HttpRequest) -> HttpResponse:
    form = SweepForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid() and "preview" not in request.POST:
        data = form.cleaned_data
        experiment = sweeps.create_experiment(
            data["team"], request.user, data["name"], data["description"], form.sweep
        )
        messages.success(request, f"Queued {experiment.runs.count()} runs.")
        return redirect("experiment-detail", experiment.pk)
    status = 422 if request.method == "POST" and form.errors else 200
    return render(request, "experiments/submit.html", {"form": form}, status=status)


def _experiment(request: HttpRequest, experiment_id: int) -> Experiment:
    return get_object_or_404(
        Experiment.visible_to(request.user).select_related("team", "owner"), pk=experiment_id
    )


@login_required
def experiment_detail(request: HttpRequest, experiment_id: int) -> HttpResponse:
    experiment = _experiment(request, experiment_id)
    return render(
        request, "experiments/detail.html", {"experiment": experiment, "runs": experiment.runs.all()}
    )


@login_required
def experiment_runs_live(request: HttpRequest, experiment_id: int) -> HttpResponse:
    experiment = _experiment(request, experiment_id)
    return render(
        request, "experiments/_runs.html", {"experiment": experiment, "runs": experiment.runs.all()}
    )


@login_required
def experiment_compare(request: HttpRequest, experiment_id: int) -> HttpResponse:
    """The dashboard page; its script draws everything from `experiment_compare_data`."""
    experiment = _experiment(request, experiment_id)
    return render(
        request,
        "experiments/compare.html",
        {
            "experiment": experiment,
            "metrics": compare.METRICS,
            "x_axes": curves.X_AXES,
            "bands": curves.BANDS,
            "rules": curves.RULES,
        },
    )


def _comparison(request: HttpRequest, experiment_id: int, table: str) -> HttpResponse:
    experiment = _experiment(request, experiment_id)
    try:
        query = compare.ComparisonQuery.parse(request.GET)
        output = request.GET.get("format", "json")
        if output not in ("json", "csv"):
            raise compare.QueryError("format", f"format must be json or csv (got {output!r})")
    except compare.QueryError as exc:
        return JsonResponse({"detail": [{"param": exc.param, "msg": exc.message}]}, status=400)
    payload = compare.compare(experiment, query)
    if output == "json":
        return JsonResponse(payload if table == "curves" else {"summary": payload["summary"]})
    text = compare.curves_csv(payload) if table == "curves" else compare.summary_csv(payload)
    response = HttpResponse(text, content_type="text/csv")
    metric = re.sub(r"[^A-Za-z0-9_.-]+", "-", query.metric).strip("-")
    response["Content-Disposition"] = (
        f'attachment; filename="experiment-{experiment.pk}-{metric}-{query.x if table == "curves" else query.rule}-{table}.csv"'
    )
    return response


@login_required
def experiment_compare_data(request: HttpRequest, experiment_id: int) -> HttpResponse:
    """Aggregated curves, summary and per-run final values as JSON; `format=csv` gives the curves."""
    return _comparison(request, experiment_id, "curves")


@login_required
def experiment_compare_summary(request: HttpRequest, experiment_id: int) -> HttpResponse:
    """The summary table (final value ± CI per preset × staleness) as JSON or, with `format=csv`, CSV."""
    return _comparison(request, experiment_id, "summary")


def _run(request: HttpRequest, run_id: int) -> Run:
    return get_object_or_404(Run.visible_to(request.user).select_related("experiment__team"), pk=run_id)


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
    return {
        "run": run,
        "steps": steps,
        "metric_rows": [(name, [table[name].get(s) for s in steps]) for name in sorted(table)],
        "completions": run.completions.all()[:RECENT_COMPLETIONS],
    }


@login_required
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    return render(request, "experiments/run.html", _run_context(_run(request, run_id)))


@login_required
def run_live(request: HttpRequest, run_id: int) -> HttpResponse:
    return render(request, "experiments/_run_live.html", _run_context(_run(request, run_id)))


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
    if run.retry():
        messages.success(request, f"Run {run.pk} queued again as attempt {run.attempt}.")
    else:
        messages.error(
            request, f"Run {run.pk} is {run.status}; only failed, cancelled or lost runs can be retried."
        )
    return redirect("run-detail", run.pk)


@login_required
def team_list(request: HttpRequest) -> HttpResponse:
    form = TeamForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        with transaction.atomic():
            team = form.save()
            Membership.objects.create(team=team, user=request.user, is_admin=True)
        return redirect("team-detail", team.pk)
    teams = Team.objects.filter(members=request.user).annotate(n_members=Count("memberships"))
    return render(request, "experiments/teams.html", {"teams": teams, "form": form})


def _team(request: HttpRequest, team_id: int) -> Team:
    return get_object_or_404(Team.objects.filter(members=request.user), pk=team_id)


@login_required
def team_detail(request: HttpRequest, team_id: int) -> HttpResponse:
    team = _team(request, team_id)
    is_admin = team.is_admin(request.user)
    form = AddMemberForm(request.POST or None)
    if request.method == "POST":
        if not is_admin:
            messages.error(request, "Only team admins can add members; ask one of them.")
            return redirect("team-detail", team.pk)
        if form.is_valid():
            try:
                Membership.objects.create(
                    team=team, user=form.cleaned_data["username"], is_admin=form.cleaned_data["is_admin"]
                )
            except IntegrityError:
                form.add_error("username", f"{form.cleaned_data['username']} is already a member of {team}")
            else:
                return redirect("team-detail", team.pk)
    memberships = team.memberships.select_related("user").order_by("user__username")
    return render(
        request,
        "experiments/team.html",
        {"team": team, "memberships": memberships, "is_admin": is_admin, "form": form},
    )


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
        membership.delete()
        messages.success(request, f"Removed {membership.user} from {team}.")
    return redirect("team-detail", team.pk)
