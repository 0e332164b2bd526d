"""URLs of alerts: a team's alert targets, added, removed and sent a test, from its team page."""

from __future__ import annotations

from django.urls import path

from alerts import views

urlpatterns = [
    path("teams/<int:team_id>/alerts/targets/", views.target_add, name="alert-target-add"),
    path(
        "teams/<int:team_id>/alerts/targets/<int:target_id>/remove/",
        views.target_remove,
        name="alert-target-remove",
    ),
    path(
        "teams/<int:team_id>/alerts/targets/<int:target_id>/test/",
        views.target_test,
        name="alert-target-test",
    ),
]
