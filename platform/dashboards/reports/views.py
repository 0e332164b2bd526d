"""The reports' pages: the team's reports and a new one, a report as published (any version),
its draft's editor with a live preview, the "compare with current data" view, the exports (one
self-contained HTML file, a zip of CSV files) and the delete. Other teams' reports are 404s."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.staticfiles import finders
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string

from accounts.models import Team
from dashboards.models import Report, ReportRun, ReportVersion
from dashboards.reports import service


def _report(request: HttpRequest, report_id: int) -> Report:
    return get_object_or_404(Report.visible_to(request.user).select_related("team", "author"), pk=report_id)


def _version(request: HttpRequest, report: Report) -> ReportVersion | None:
    """`?version=N` of the report (a 404 when it has none such), else its latest."""
    number = request.GET.get("version", "")
    if number:
        return get_object_or_404(report.versions, number=int(number) if number.isdigit() else -1)
    return report.latest()


# What report.js needs of a chart block's frozen comparison to draw it as its link shows it.
CHART_DATA = ("metric", "x", "band", "colours", "groups", "staleness", "fields", "palette")
# The comparison page's drawing choices a link may carry, as its page reads them (compare.js).
CHART_VIEW = ("view", "facet", "colour")


def _charts(blocks: list[dict]) -> dict[str, dict]:
    """What the page's script draws, by block index: each chart block's curves, and the view its
    link asked for (small multiples by a field, or one overlay; its colours)."""
    return {
        str(i): {k: block["data"].get(k) for k in CHART_DATA}
        | {k: (block.get("query") or {}).get(k) for k in CHART_VIEW}
        for i, block in enumerate(blocks)
        if block.get("kind") == "chart" and "data" in block
    }


def _body(source: str, blocks: list[dict], images: bool = True) -> dict:
    return {"parts": service.parts(source, blocks, images), "charts": _charts(blocks)}


def _live_blocks(report: Report) -> tuple[list[dict], str]:
    """The draft's blocks computed now (a failed one is {"error": …}), and the source's mistake."""
    try:
        parsed = service.parse(report.source)
    except service.ReportError as exc:
        return [], exc.message
    blocks = []
    for part in parsed:
        if isinstance(part, service.Block):
            try:
                blocks.append(service.compute(report.team, part))
            except service.ReportError as exc:
                blocks.append({"kind": part.kind, "link": part.link, "line": part.line, "error": exc.message})
    return blocks, ""


@login_required
def report_list(request: HttpRequest) -> HttpResponse:
    """GET: the reports of the user's teams; POST: start one (title, team) and open its editor."""
    teams = Team.objects.filter(memberships__user=request.user).order_by("name")
    error = ""
    if request.method == "POST":
        chosen = request.POST.get("team", "")
        team = teams.filter(pk=int(chosen)).first() if chosen.isdigit() and len(chosen) <= 18 else None
        if team is None and not chosen and len(teams) == 1:
            team = teams.first()
        try:
            title = service.check_title(request.POST.get("title", ""))
            if team is None:
                raise service.ReportError("team", "choose one of your teams")
        except service.ReportError as exc:
            error = f"{exc.field}: {exc.message}"
        else:
            report = Report.objects.create(team=team, author=request.user, title=title)
            return redirect("report-edit", report.pk)
    found = Report.visible_to(request.user).select_related("team", "author").prefetch_related("versions")
    return render(request, "dashboards/report_list.html", {"reports": found, "teams": teams, "error": error})


@login_required
def report_detail(request: HttpRequest, report_id: int) -> HttpResponse:
    """The report as published (its latest version, or `?version=N`); a draft never published
    shows its live preview, said so."""
    report = _report(request, report_id)
    version = _version(request, report)
    if version is None:
        blocks, error = _live_blocks(report)
        body = _body(report.source, blocks) if not error else {"parts": [], "charts": {}}
        context = {"draft": True, "source_error": error, "title": report.title}
    else:
        body = _body(version.source, version.blocks)
        context = {"draft": False, "title": version.title}
    return render(
        request,
        "dashboards/report.html",
        {
            **context,
            **body,
            "report": report,
            "version": version,
            "versions": report.versions.select_related("author"),
            "may_edit": service.may_edit(request.user, report),
        },
    )


@login_required
def report_edit(request: HttpRequest, report_id: int) -> HttpResponse:
    """The draft's editor: `save` keeps it (a block's mistake is named, the text is kept),
    `publish` saves and freezes it as the next version."""
    report = _report(request, report_id)
    if not service.may_edit(request.user, report):
        return HttpResponse("Only its author or an admin of its team can edit a report.", status=403)
    error = ""
    title, source = report.title, report.source
    if request.method == "POST":
        title, source = request.POST.get("title", ""), request.POST.get("source", "")
        try:
            service.save(report, title, source)
            if request.POST.get("action") == "publish":
                version = service.publish(report, request.user)
                messages.success(request, f"Published version {version.number}: its numbers are frozen.")
                return redirect("report-detail", report.pk)
            messages.success(request, "Draft saved.")
            return redirect("report-edit", report.pk)
        except service.ReportError as exc:
            error = f"{exc.field}: {exc.message}"
    blocks, source_error = _live_blocks(report)
    preview = _body(report.source, blocks) if not source_error else {"parts": [], "charts": {}}
    return render(
        request,
        "dashboards/report_edit.html",
        {
            "report": report,
            "title": title,
            "source": source,
            "error": error,
            "source_error": source_error,
            **preview,
        },
        status=422 if error else 200,
    )


@login_required
def report_current(request: HttpRequest, report_id: int) -> HttpResponse:
    """The published version's blocks beside what their links give now."""
    report = _report(request, report_id)
    version = _version(request, report)
    if version is None:
        messages.error(request, "This report is not published yet: its draft shows the data now.")
        return redirect("report-detail", report.pk)
    return render(
        request,
        "dashboards/report_current.html",
        {"report": report, "version": version, "blocks": service.current(version)},
    )


def _static(name: str) -> str:
    return Path(finders.find(name)).read_text(encoding="utf-8")


def export_policy(scripts: list[str]) -> str:
    """The exported file's Content-Security-Policy, for its `<meta>` (a file opened from disk has no
    headers): its own inline `scripts` only, by their hashes; inline styles (Plotly sets them);
    images only as data: URLs; nothing fetched from any host, no form sent, no base changed."""
    hashes = [f"'sha256-{base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()}'" for s in scripts]
    return "; ".join(
        [
            "default-src 'none'",
            f"script-src {' '.join(hashes)}",
            "style-src 'unsafe-inline'",
            "img-src data:",
            "connect-src 'none'",
            "base-uri 'none'",
            "form-action 'none'",
        ]
    )


def export_html(request: HttpRequest, report: Report, version: ReportVersion) -> HttpResponse:
    """The published `version` as one HTML file: its prose, tables and claims, and its charts drawn
    by Plotly from the data inline, so it opens offline; its CSP (`export_policy`) lets it load
    nothing, and its prose's images are links (`service.prose_html`). The page and the API serve it."""
    scripts = [
        _static(name)
        for name in ("plotly/plotly-cartesian.min.js", "experiments/plots.js", "dashboards/report.js")
    ]
    html = render_to_string(
        "dashboards/report_export.html",
        {
            **_body(version.source, version.blocks, images=False),
            "report": report,
            "version": version,
            "title": version.title,
            "scripts": scripts,
            "policy": export_policy(scripts),
        },
        request=request,
    )
    response = HttpResponse(html, content_type="text/html; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="report-{report.pk}-v{version.number}.html"'
    return response


def export_csv(report: Report, version: ReportVersion) -> HttpResponse:
    """The published `version`'s numbers as a zip of CSV files (`service.csv_bundle`)."""
    response = HttpResponse(service.csv_bundle(version), content_type="application/zip")
    response["Content-Disposition"] = f'attachment; filename="report-{report.pk}-v{version.number}-csv.zip"'
    return response


NOT_PUBLISHED = "Publish the report first: only a published version is exported."


def _exported(request: HttpRequest, report_id: int, export) -> HttpResponse:
    """`export(report, version)` of the version asked for (or the latest published), or 409."""
    report = _report(request, report_id)
    version = _version(request, report)
    if version is None:
        return HttpResponse(NOT_PUBLISHED, status=409)
    return export(report, version)


@login_required
def report_export_html(request: HttpRequest, report_id: int) -> HttpResponse:
    return _exported(request, report_id, lambda report, version: export_html(request, report, version))


@login_required
def report_export_csv(request: HttpRequest, report_id: int) -> HttpResponse:
    return _exported(request, report_id, export_csv)


@login_required
def report_delete(request: HttpRequest, report_id: int) -> HttpResponse:
    """GET: what deleting the report would delete; POST: delete the report and its versions (their
    runs are then no longer held). Its author or a team admin."""
    report = _report(request, report_id)
    if not service.may_edit(request.user, report):
        return HttpResponse("Only its author or an admin of its team can delete a report.", status=403)
    if request.method == "POST":
        report.delete()
        messages.success(request, f"Deleted the report “{report.title}” and its versions.")
        return redirect("report-list")
    return render(
        request,
        "dashboards/report_delete.html",
        {
            "report": report,
            "versions": report.versions.count(),
            "runs": ReportRun.objects.filter(version__report=report).values("run").distinct().count(),
        },
    )
