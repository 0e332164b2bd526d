"""URLs of accounts: login, teams and their invitations and members, API tokens."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path

from accounts import views

urlpatterns = [
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("login/", views.LoginView.as_view(), name="login"),
    path("account/tokens/", views.api_tokens, name="api-tokens"),
    path("account/tokens/<int:token_id>/revoke/", views.api_token_revoke, name="api-token-revoke"),
    path("teams/", views.team_list, name="team-list"),
    path("teams/<int:team_id>/", views.team_detail, name="team-detail"),
    path("teams/<int:team_id>/mirror/", views.team_mirror, name="team-mirror"),
    path(
        "teams/invitations/<int:invitation_id>/accept/",
        views.invitation_answer,
        {"accept": True},
        name="invitation-accept",
    ),
    path(
        "teams/invitations/<int:invitation_id>/decline/",
        views.invitation_answer,
        {"accept": False},
        name="invitation-decline",
    ),
    path(
        "teams/<int:team_id>/invitations/<int:invitation_id>/revoke/",
        views.invitation_revoke,
        name="invitation-revoke",
    ),
    path(
        "teams/<int:team_id>/members/<int:membership_id>/remove/",
        views.team_remove_member,
        name="team-remove-member",
    ),
]
