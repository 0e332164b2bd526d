"""URLs of the reports' pages."""

from __future__ import annotations

from django.urls import path

from dashboards.reports import views

urlpatterns = [
    path("reports/", views.report_list, name="report-list"),
    path("reports/<int:report_id>/", views.report_detail, name="report-detail"),
    path("reports/<int:report_id>/edit", views.report_edit, name="report-edit"),
    path("reports/<int:report_id>/current", views.report_current, name="report-current"),
    path("reports/<int:report_id>/export.html", views.report_export_html, name="report-export-html"),
    path("reports/<int:report_id>/export-csv.zip", views.report_export_csv, name="report-export-csv"),
    path("reports/<int:report_id>/delete", views.report_delete, name="report-delete"),
]
