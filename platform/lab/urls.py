"""URL map: pages, the API at /api/, the admin, login/logout."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.templatetags.static import static
from django.urls import path
from django.views.generic import RedirectView
from experiments import views
from experiments.api import api

handler500 = "lab.middleware.server_error"

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="experiment-list"), name="home"),
    path("health", views.health, name="health"),
    # Browsers ask for /favicon.ico on pages without our <link rel=icon> (the admin, the API docs).
    path("favicon.ico", RedirectView.as_view(url=static("experiments/favicon.svg"), permanent=True)),
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    path("experiments/", views.experiment_list, name="experiment-list"),
    path("experiments/new/", views.submit_sweep, name="submit-sweep"),
    path("experiments/<int:experiment_id>/", views.experiment_detail, name="experiment-detail"),
    path("experiments/<int:experiment_id>/cancel/", views.experiment_cancel, name="experiment-cancel"),
    path("experiments/<int:experiment_id>/archive/", views.experiment_archive, name="experiment-archive"),
    path(
        "experiments/<int:experiment_id>/unarchive/", views.experiment_unarchive, name="experiment-unarchive"
    ),
    path("experiments/<int:experiment_id>/delete/", views.experiment_delete, name="experiment-delete"),
    path(
        "experiments/<int:experiment_id>/save-template/",
        views.experiment_save_template,
        name="experiment-save-template",
    ),
    path("experiments/<int:experiment_id>/live/", views.experiment_runs_live, name="experiment-runs-live"),
    path("experiments/<int:experiment_id>/compare/", views.experiment_compare, name="experiment-compare"),
    path(
        "experiments/<int:experiment_id>/compare/data",
        views.experiment_compare_data,
        name="experiment-compare-data",
    ),
    path(
        "experiments/<int:experiment_id>/compare/summary",
        views.experiment_compare_summary,
        name="experiment-compare-summary",
    ),
    path("runs/", views.run_list, name="run-list"),
    path("compare/", views.runs_compare, name="runs-compare"),
    path("compare/data", views.runs_compare_data, name="runs-compare-data"),
    path("compare/summary", views.runs_compare_summary, name="runs-compare-summary"),
    path("runs/<int:run_id>/", views.run_detail, name="run-detail"),
    path("runs/<int:run_id>/live/", views.run_live, name="run-live"),
    path("runs/<int:run_id>/curves", views.run_curves, name="run-curves"),
    path("runs/<int:run_id>/metrics.csv", views.run_metrics_csv, name="run-metrics-csv"),
    path("runs/<int:run_id>/cancel/", views.run_cancel, name="run-cancel"),
    path("runs/<int:run_id>/retry/", views.run_retry, name="run-retry"),
    path("account/tokens/", views.api_tokens, name="api-tokens"),
    path("account/tokens/<int:token_id>/revoke/", views.api_token_revoke, name="api-token-revoke"),
    path("teams/", views.team_list, name="team-list"),
    path("teams/<int:team_id>/", views.team_detail, name="team-detail"),
    path("teams/invitations/<int:invitation_id>/accept/", views.invitation_accept, name="invitation-accept"),
    path(
        "teams/invitations/<int:invitation_id>/decline/", views.invitation_decline, name="invitation-decline"
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
