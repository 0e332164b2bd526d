"""The API's imports (mounted by `lab.api`): the tools and their default mappings, and a run imported
from a file uploaded as multipart/form-data into an experiment of your teams (another team's is a
404). A refused file is a 422 naming the field (`file`: the file and its line or record) and
nothing is stored; a file over LAB_IMPORT_MAX_BYTES is a 413. The same file again changes nothing
(200, `created` false)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from ninja import File, Form, Router, Status
from ninja.files import UploadedFile

from experiments.models import Experiment
from imports import formats, service, uploads
from imports.models import Import
from imports.schemas import ImportIn, ImportOut, ToolsOut
from lab.schemas import responses

router = Router()
FILE = File(None)  # optional, so that a missing file is answered in the lab's words


def import_out(record: Import, created: bool) -> dict[str, Any]:
    run = record.run
    return {
        **{name: getattr(record, name) for name in ImportOut.model_fields if hasattr(Import, name)},
        "id": record.pk,
        "run": run.pk,
        "experiment": record.experiment_id,
        "created": created,
        "imported_by": record.imported_by.get_username() if record.imported_by else None,
        "preset": run.preset,
        "staleness": run.staleness,
        "seed": run.seed,
    }


def _refused(field: str, message: str) -> Status:
    return Status(422, {"detail": [{"loc": ["body", field], "field": field, "msg": message}]})


@router.get("/imports/tools", response=responses({200: ToolsOut}))
def list_tools(request: HttpRequest):
    """The tools whose files can be imported, each with its default mapping of metric names."""
    return {
        "tools": [
            {"tool": tool, "mapping": formats.DEFAULT_MAPPINGS.get(tool, {})} for tool in formats.TOOLS
        ],
        "max_bytes": settings.LAB_IMPORT_MAX_BYTES,
    }


@router.post(
    "/experiments/{experiment_id}/imports",
    response=responses({200: ImportOut, 201: ImportOut}, 404, 413, 422),
)
def import_run(
    request: HttpRequest, experiment_id: int, body: Form[ImportIn], file: UploadedFile | None = FILE
):
    """Import a run from another tool's file into the experiment, read-only, at the preset, staleness
    cell and seed given (or the file's config's), its metric names mapped by the tool's mapping with
    your changes (`map`). 201 with the import; 200 (`created` false) when the experiment holds this
    file already."""
    experiment = get_object_or_404(Experiment.visible_to(request.user), pk=experiment_id)
    if refusal := uploads.refusal(request):
        return Status(413, {"detail": refusal})
    if file is None:
        return _refused("file", "attach the file to import (multipart/form-data field `file`)")
    try:
        mapping = service.parse_mapping(body.map)
        with uploads.staged(file) as path:
            outcome = service.import_file(
                experiment,
                request.user,
                body.tool,
                path,
                service.Placement(body.preset, body.staleness, body.seed),
                mapping,
                name=path.name,
                run=body.run,
            )
    except service.ImportRefused as exc:
        return _refused(exc.field, exc.message)
    return Status(201 if outcome.created else 200, import_out(outcome.record, outcome.created))
