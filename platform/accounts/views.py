"""Pages of accounts: log in, teams and their members and invitations, API tokens. Every query
goes through the user's memberships, so another team's objects are 404s."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.exceptions import NON_FIELD_ERRORS
from django.db import transaction
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from accounts.forms import InviteForm, LoginForm, TeamForm, TeamMirrorForm, TokenForm
from accounts.models import ApiToken, Invitation, Membership, Team, TooManyTokens


class LoginView(auth_views.LoginView):
    """Django's login page; a login refused by the rate limits is a 429 with Retry-After."""

    form_class = LoginForm
    template_name = "accounts/login.html"

    def form_invalid(self, form):
        response = super().form_invalid(form)
        if form.has_error(NON_FIELD_ERRORS, "throttled"):
            response.status_code = 429
            response["Retry-After"] = str(self.request.login_retry_after)
        return response


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
    return render(request, "accounts/teams.html", {"teams": teams, "form": form, "invitations": invitations})


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
    return _team_page(request, team, is_admin, form, TeamMirrorForm(instance=team))


def _team_page(
    request: HttpRequest,
    team: Team,
    is_admin: bool,
    form: InviteForm,
    mirror_form: TeamMirrorForm,
    status=200,
) -> HttpResponse:
    memberships = team.memberships.select_related("user").order_by("user__username")
    invitations = (
        team.invitations.select_related("user", "invited_by").order_by("created") if is_admin else []
    )
    return render(
        request,
        "accounts/team.html",
        {
            "team": team,
            "memberships": memberships,
            "admins": sum(m.is_admin for m in memberships),
            "is_admin": is_admin,
            "form": form,
            "mirror_form": mirror_form,
            "invitations": invitations,
        },
        status=status,
    )


@login_required
@require_POST
def team_mirror(request: HttpRequest, team_id: int) -> HttpResponse:
    """A team admin sets where the team's runs are mirrored (MLflow, TensorBoard files); an
    address that is not http(s) is shown on the form, with the rule."""
    team = _team(request, team_id)
    if not team.is_admin(request.user):
        messages.error(
            request, "Only team admins can change where the team's runs are mirrored; ask one of them."
        )
        return redirect("team-detail", team.pk)
    form = TeamMirrorForm(request.POST, instance=team)
    if not form.is_valid():
        return _team_page(request, Team.objects.get(pk=team.pk), True, InviteForm(), form, status=400)
    form.save()
    messages.success(request, f"The runs of {team} started from now on are mirrored as set.")
    return redirect("team-detail", team.pk)


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
def invitation_answer(request: HttpRequest, invitation_id: int, accept: bool) -> HttpResponse:
    """The invited user accepts (and joins the team) or declines one of their invitations."""
    invitation = get_object_or_404(request.user.team_invitations.select_related("team"), pk=invitation_id)
    if not accept:
        invitation.delete()
        messages.success(request, f"Declined the invitation to {invitation.team}.")
        return redirect("team-list")
    membership = invitation.accept()
    messages.success(request, f"You joined {membership.team}{' as an admin' if membership.is_admin else ''}.")
    return redirect("team-detail", membership.team_id)


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
        "accounts/tokens.html",
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
