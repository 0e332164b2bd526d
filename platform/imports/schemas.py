"""What the API's import operations take and answer, as OpenAPI documents it."""

from __future__ import annotations

from datetime import datetime

from ninja import Field, Schema

from imports.service import STALENESS_SYNTAX
from lab.schemas import NoNul


class ImportIn(Schema):
    """The form fields beside the file (multipart/form-data)."""

    tool: NoNul = Field(description="the tool that wrote the file: GET /api/imports/tools lists them")
    preset: NoNul | None = Field(None, description="the run's preset; default: the file's config's `preset`")
    staleness: NoNul | None = Field(
        None, description=f"the run's staleness cell: {STALENESS_SYNTAX}; default: the file's config's"
    )
    seed: int | None = Field(None, description="the run's seed; default: the file's config's `seed`")
    run: NoNul | None = Field(
        None, description="the run to read, in a file that holds several (a Trackio project)"
    )
    map: list[NoNul] = Field(
        [],
        description="changes to the tool's mapping of metric names, each source_name=lab_name; names the "
        "mapping leaves out are stored under imported/",
    )


class ImportOut(Schema):
    id: int
    run: int
    experiment: int
    created: bool = Field(
        description="false: the experiment held this file already (same sha256), nothing changed"
    )
    tool: str
    tool_version: str = Field(description="as the file says; empty if unknown")
    original_run_id: str = Field(description="the run's id in its own tool; empty if unknown")
    file_name: str
    file_size: int
    sha256: str
    run_name: str = Field(description="the run read, in a file that holds several; empty otherwise")
    mapping: dict[str, str] = Field(description="{source metric name: lab metric name} as stored")
    points: int
    first_time: datetime | None = Field(description="the earliest time the file logged")
    last_time: datetime | None = Field(description="the latest time the file logged")
    imported_by: str | None
    imported_at: datetime
    preset: str
    staleness: str
    seed: int


class ToolOut(Schema):
    tool: str
    mapping: dict[str, str] = Field(description="its default mapping, source metric name → lab metric name")


class ToolsOut(Schema):
    tools: list[ToolOut]
    max_bytes: int = Field(description="the largest file an import takes (LAB_IMPORT_MAX_BYTES)")
