"""Reports as API operations (`dashboards.reports.service`): write a draft, publish it (freeze its numbers
as a new version), read any version, set it beside the data now, delete it. Another team's report
does not exist for the caller (404)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from ninja import Router, Status

from accounts.models import Team
from dashboards.models import Report, ReportVersion
from dashboards.reports import service, views
from dashboards.reports.schemas import (
    ReportCurrentOut,
    ReportDeletedOut,
    ReportEditIn,
    ReportIn,
    ReportOut,
    ReportsOut,
)
from lab.schemas import responses

router = Router()


def _error(exc: service.ReportError) -> Status:
    return Status(422, {"detail": [{"loc": ["body", exc.field], "field": exc.field, "msg": exc.message}]})


def _report(request: HttpRequest, report_id: int) -> Report:
    return get_object_or_404(Report.visible_to(request.user).select_related("team", "author"), pk=report_id)


def _version_out(version: ReportVersion) -> dict[str, Any]:
    return {
        "number": version.number,
        "title": version.title,
        "source": version.source,
        "published": version.published,
        "author": version.author.get_username(),
        "blocks": version.blocks,
    }


def _out(report: Report, version: ReportVersion | None = None) -> dict[str, Any]:
    return {
        "id": report.pk,
        "team": report.team_id,
        "title": report.title,
        "source": report.source,
        "author": report.author.get_username(),
        "created": report.created,
        "updated": report.updated,
        "versions": [
            {
                "number": v.number,
                "title": v.title,
                "published": v.published,
                "author": v.author.get_username(),
            }
            for v in report.versions.select_related("author")
        ],
        "version": None if version is None else _version_out(version),
    }


def _forbidden() -> Status:
    return Status(403, {"detail": "only its author or an admin of its team can change a report"})


@router.get("/reports", response=responses({200: ReportsOut}), operation_id="dashboards_api_list_reports")
def list_reports(request: HttpRequest):
    """Your teams' reports, last changed first (their versions listed, none of their blocks)."""
    found = Report.visible_to(request.user).select_related("team", "author")[:200]
    return {"reports": [_out(report) for report in found]}


@router.post(
    "/reports", response=responses({201: ReportOut}, 404, 422), operation_id="dashboards_api_create_report"
)
def create_report(request: HttpRequest, body: ReportIn):
    """Start a report in one of your teams; with `publish`, publish it at once."""
    teams = Team.objects.filter(memberships__user=request.user).order_by("pk")
    team = get_object_or_404(teams, pk=body.team) if body.team is not None else teams.first()
    if team is None:
        return Status(
            422, {"detail": [{"loc": ["body", "team"], "field": "team", "msg": "you are in no team"}]}
        )
    try:
        title = service.check_title(body.title)
        service.parse(body.source)
        report = Report.objects.create(team=team, author=request.user, title=title, source=body.source)
        version = service.publish(report, request.user) if body.publish else None
    except service.ReportError as exc:
        return _error(exc)
    return Status(201, _out(report, version))


@router.get(
    "/reports/{report_id}",
    response=responses({200: ReportOut}, 404),
    operation_id="dashboards_api_get_report",
)
def get_report(request: HttpRequest, report_id: int, version: int | None = None):
    """A report with its latest published version (or `version`), every block's frozen numbers."""
    report = _report(request, report_id)
    shown = get_object_or_404(report.versions, number=version) if version is not None else report.latest()
    return _out(report, shown)


@router.put(
    "/reports/{report_id}",
    response=responses({200: ReportOut}, 403, 404, 422),
    operation_id="dashboards_api_edit_report",
)
def edit_report(request: HttpRequest, report_id: int, body: ReportEditIn):
    """Change the draft's title or source (published versions stay as they are)."""
    report = _report(request, report_id)
    if not service.may_edit(request.user, report):
        return _forbidden()
    try:
        service.save(report, body.title, body.source)
    except service.ReportError as exc:
        return _error(exc)
    return _out(report, report.latest())


@router.post(
    "/reports/{report_id}/publish",
    response=responses({201: ReportOut}, 403, 404, 422),
    operation_id="dashboards_api_publish_report",
)
def publish_report(request: HttpRequest, report_id: int):
    """Publish the draft as the next version: its blocks' run ids, queries and numbers are frozen,
    and the runs they cite can be archived but not deleted."""
    report = _report(request, report_id)
    if not service.may_edit(request.user, report):
        return _forbidden()
    try:
        version = service.publish(report, request.user)
    except service.ReportError as exc:
        return _error(exc)
    return Status(201, _out(report, version))


@router.get(
    "/reports/{report_id}/current",
    response=responses({200: ReportCurrentOut}, 404, 409),
    operation_id="dashboards_api_report_current",
)
def report_current(request: HttpRequest, report_id: int, version: int | None = None):
    """A published version's blocks beside what their links give now: runs added, archived or
    deleted since, and each number then and now."""
    report = _report(request, report_id)
    shown = get_object_or_404(report.versions, number=version) if version is not None else report.latest()
    if shown is None:
        return Status(409, {"detail": "the report is not published yet"})
    return {"report": report.pk, "version": shown.number, "blocks": service.current(shown)}


@router.delete(
    "/reports/{report_id}",
    response=responses({200: ReportDeletedOut}, 403, 404),
    operation_id="dashboards_api_delete_report",
)
def delete_report(request: HttpRequest, report_id: int):
    """Delete a report and its versions: its author or an admin of its team."""
    report = _report(request, report_id)
    if not service.may_edit(request.user, report):
        return _forbidden()
    deleted = report.pk
    report.delete()
    return {"report": deleted}


def _file(media_type: str, description: str) -> dict[str, Any]:
    """An operation's OpenAPI `200` when it answers a file, not JSON."""
    return {
        "responses": {
            200: {
                "description": description,
                "content": {media_type: {"schema": {"type": "string", "format": "binary"}}},
            }
        }
    }


def _published(
    request: HttpRequest, report_id: int, version: int | None
) -> tuple[Report, ReportVersion | None]:
    report = _report(request, report_id)
    if version is not None:
        return report, get_object_or_404(report.versions, number=version)
    return report, report.latest()


@router.get(
    "/reports/{report_id}/export.html",
    response=responses({}, 404, 409),
    openapi_extra=_file("text/html", "the published version as one HTML file that opens offline"),
    operation_id="dashboards_api_export_report_html",
)
def export_report_html(request: HttpRequest, report_id: int, version: int | None = None):
    """The published version (`version`, else the latest) as the page's HTML export: one file
    with its charts' data and Plotly inline, loading nothing (its own CSP); 409 before publishing."""
    report, shown = _published(request, report_id, version)
    if shown is None:
        return Status(409, {"detail": views.NOT_PUBLISHED})
    return views.export_html(request, report, shown)


@router.get(
    "/reports/{report_id}/export-csv.zip",
    response=responses({}, 404, 409),
    openapi_extra=_file("application/zip", "the published version's numbers, a CSV file per block"),
    operation_id="dashboards_api_export_report_csv",
)
def export_report_csv(request: HttpRequest, report_id: int, version: int | None = None):
    """The published version's numbers (`version`, else the latest) as a zip of CSV files; 409
    before publishing."""
    report, shown = _published(request, report_id, version)
    if shown is None:
        return Status(409, {"detail": views.NOT_PUBLISHED})
    return views.export_csv(report, shown)
