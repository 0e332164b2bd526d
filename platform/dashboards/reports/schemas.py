"""A report, its versions and what its blocks give now, as the API takes and answers them
(`dashboards.reports.service`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ninja import Field, Schema

from lab.schemas import NoNul


class ReportIn(Schema):
    title: NoNul = Field(description="1 to 300 characters")
    source: NoNul = Field(
        "",
        description="Markdown; a block is a line of its own, {{ chart LINK }}, {{ table LINK }} or "
        "{{ claim LINK }}, LINK a comparison's (/experiments/ID/compare/?… or /compare/?runs=…) or a claim's",
    )
    team: int | None = Field(None, description="one of your teams (your first one when omitted)")
    publish: bool = Field(False, description="publish it at once (freeze its numbers as version 1)")


class ReportEditIn(Schema):
    title: NoNul | None = None
    source: NoNul | None = None


class ReportVersionOut(Schema):
    number: int
    title: str
    source: str
    published: datetime
    author: str
    blocks: list[dict[str, Any]] = Field(
        description="each block as frozen: kind, link, line, run_ids and its numbers (a comparison's "
        "`query` and `data`, the payload of GET /compare with the statistics' method, reps and seed; "
        "a claim's `claim`, as GET /claims/{id} gave it)"
    )


class ReportVersionRefOut(Schema):
    number: int
    title: str
    published: datetime
    author: str


class ReportOut(Schema):
    id: int
    team: int
    title: str
    source: str = Field(description="the draft")
    author: str
    created: datetime
    updated: datetime
    versions: list[ReportVersionRefOut] = Field(description="newest first")
    version: ReportVersionOut | None = Field(
        description="the latest published version, or the one asked for; null in lists and while a draft"
    )


class ReportsOut(Schema):
    reports: list[ReportOut]


class ReportCurrentOut(Schema):
    report: int
    version: int
    blocks: list[dict[str, Any]] = Field(
        description="each block's runs added, archived and deleted since, and its cells' (or the claim's "
        "verdicts') numbers then and now, with `changed`"
    )


class ReportDeletedOut(Schema):
    report: int = Field(description="the report deleted")
