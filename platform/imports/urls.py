"""URLs of the imports pages: an experiment's import form."""

from __future__ import annotations

from django.urls import path

from imports import views

urlpatterns = [
    path("experiments/<int:experiment_id>/import/", views.import_run, name="experiment-import"),
]
