"""URLs of the comparison dashboards (an experiment's, hand-picked runs', a run's curves), of claims
and of reports."""

from __future__ import annotations

from django.urls import path

from dashboards import claim_pages, report_pages, views

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
    path("claims/data", claim_pages.claims_data, name="claims-data"),
    path("claims/new", claim_pages.claim_new, name="claim-new"),
    path("claims/<int:claim_id>/", claim_pages.claim_detail, name="claim-detail"),
    path("claims/<int:claim_id>/withdraw", claim_pages.claim_withdraw, name="claim-withdraw"),
    path("reports/", report_pages.report_list, name="report-list"),
    path("reports/<int:report_id>/", report_pages.report_detail, name="report-detail"),
    path("reports/<int:report_id>/edit", report_pages.report_edit, name="report-edit"),
    path("reports/<int:report_id>/current", report_pages.report_current, name="report-current"),
    path("reports/<int:report_id>/export.html", report_pages.report_export_html, name="report-export-html"),
    path("reports/<int:report_id>/export-csv.zip", report_pages.report_export_csv, name="report-export-csv"),
    path("reports/<int:report_id>/delete", report_pages.report_delete, name="report-delete"),
]
