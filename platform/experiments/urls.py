"""URLs of experiments and runs: lists, the new-sweep form, detail pages and their actions."""

from __future__ import annotations

from django.urls import path

from experiments import run_list, views

urlpatterns = [
    path("experiments/", views.experiment_list, name="experiment-list"),
    path("experiments/new/", views.submit_sweep, name="submit-sweep"),
    path("experiments/<int:experiment_id>/", views.experiment_detail, name="experiment-detail"),
    path("experiments/<int:experiment_id>/cancel/", views.experiment_cancel, name="experiment-cancel"),
    path("experiments/<int:experiment_id>/seeds/", views.experiment_seeds, name="experiment-seeds"),
    path(
        "experiments/<int:experiment_id>/archive/",
        views.experiment_set_archived,
        {"archived": True},
        name="experiment-archive",
    ),
    path(
        "experiments/<int:experiment_id>/unarchive/",
        views.experiment_set_archived,
        {"archived": False},
        name="experiment-unarchive",
    ),
    path("experiments/<int:experiment_id>/delete/", views.experiment_delete, name="experiment-delete"),
    path(
        "experiments/<int:experiment_id>/save-template/",
        views.experiment_save_template,
        name="experiment-save-template",
    ),
    path("experiments/<int:experiment_id>/live/", views.experiment_runs_live, name="experiment-runs-live"),
    path("runs/", run_list.run_list, name="run-list"),
    path("runs/tag", run_list.runs_tag, name="runs-tag"),
    path("runs/<int:run_id>/notes", run_list.note_add, name="run-notes"),
    path("runs/<int:run_id>/tags", run_list.tags_change, name="run-tags"),
    path("experiments/<int:experiment_id>/notes", run_list.note_add, name="experiment-notes"),
    path("notes/<int:note_id>/delete", run_list.note_delete, name="note-delete"),
    path("experiments/<int:experiment_id>/tags", run_list.tags_change, name="experiment-tags"),
    path("runs/views/save", run_list.view_save, name="view-save"),
    path("runs/views/<int:view_id>/delete", run_list.view_delete, name="view-delete"),
    path("runs/<int:run_id>/", views.run_detail, name="run-detail"),
    path("runs/<int:run_id>/live/", views.run_live, name="run-live"),
    path("runs/<int:run_id>/metrics.csv", views.run_metrics_csv, name="run-metrics-csv"),
    path("runs/<int:run_id>/cancel/", views.run_cancel, name="run-cancel"),
    path("runs/<int:run_id>/retry/", views.run_retry, name="run-retry"),
    path("runs/<int:run_id>/archive/", views.run_archive, name="run-archive"),
]
