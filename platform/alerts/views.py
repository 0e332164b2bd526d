"""The alerts section of a team's page: its admins add and remove targets and send a test to one
(all POST, as the rest of the team's settings); the section lists the targets and the delivery
log (`section`, drawn on the team page by `{% alerts_section %}`). A target the form refuses is
shown again, with the error under its field, on a page of the section alone."""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from accounts.models import Team
from alerts import emit
from alerts.forms import TargetForm
from alerts.models import EVENTS, TEST, DeliveryAttempt

LOG_ROWS = 50


def section(team: Team, form: TargetForm | None = None) -> dict:
    """What the team page shows of its alerts: targets, the form, the latest delivery attempts."""
    return {
        "alert_targets": team.alert_targets.all(),
        "alert_form": form or TargetForm(),
        "alert_events": EVENTS,
        "alert_log": DeliveryAttempt.objects.filter(delivery__event__team=team).select_related(
            "delivery__event", "delivery__target"
        )[:LOG_ROWS],
    }


def _admin_team(request: HttpRequest, team_id: int) -> Team | None:
    team = get_object_or_404(Team.objects.filter(members=request.user), pk=team_id)
    if not team.is_admin(request.user):
        messages.error(request, "Only team admins can change the team's alerts; ask one of them.")
        return None
    return team


def _back(team_id: int) -> HttpResponse:
    return redirect(reverse("team-detail", args=[team_id]) + "#alerts")


@login_required
@require_POST
def target_add(request: HttpRequest, team_id: int) -> HttpResponse:
    team = _admin_team(request, team_id)
    if team is None:
        return _back(team_id)
    form = TargetForm(request.POST)
    if not form.is_valid():
        return render(request, "alerts/targets.html", {"team": team, **section(team, form)}, status=400)
    target = form.save(commit=False)
    target.team, target.created_by = team, request.user
    target.save()
    messages.success(request, f"Added the alert target {target}.")
    return _back(team.pk)


@login_required
@require_POST
def target_remove(request: HttpRequest, team_id: int, target_id: int) -> HttpResponse:
    team = _admin_team(request, team_id)
    if team is not None:
        target = get_object_or_404(team.alert_targets, pk=target_id)
        target.delete()
        messages.success(request, f"Removed the alert target {target}.")
    return _back(team_id)


@login_required
@require_POST
def target_test(request: HttpRequest, team_id: int, target_id: int) -> HttpResponse:
    """Queue a test event to this one target; a worker delivers it like any other."""
    team = _admin_team(request, team_id)
    if team is not None:
        target = get_object_or_404(team.alert_targets, pk=target_id)
        emit.emit(
            team.pk,
            TEST,
            f"test {uuid.uuid4()}",
            f"a test alert from team {team}, sent by {request.user}",
            {"sent_by": request.user.get_username(), "target": target.pk},
            targets=[target],
        )
        messages.success(
            request,
            f"A test alert to {target} is queued: a worker sends it within seconds (see the log below).",
        )
    return _back(team_id)
