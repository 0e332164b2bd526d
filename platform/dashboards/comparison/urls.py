"""URLs of the comparison dashboards: an experiment's, hand-picked runs', a run's curves."""

from __future__ import annotations

from django.urls import path

from dashboards.comparison import views

urlpatterns = [
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
    path("compare/", views.runs_compare, name="runs-compare"),
    path("compare/data", views.runs_compare_data, name="runs-compare-data"),
    path("compare/summary", views.runs_compare_summary, name="runs-compare-summary"),
    path("runs/<int:run_id>/curves", views.run_curves, name="run-curves"),
]
