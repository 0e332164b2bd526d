"""The import page of an experiment: the form (`ImportForm`), the file streamed to disk and cut off
past LAB_IMPORT_MAX_BYTES (`uploads`), then `service.import_file`; a refusal is shown beside its
field and nothing is stored. Another team's experiment is a 404."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render

from experiments.models import Experiment
from imports import formats, service, uploads
from imports.forms import ImportForm


@login_required
def import_run(request: HttpRequest, experiment_id: int) -> HttpResponse:
    experiment = get_object_or_404(
        Experiment.visible_to(request.user).select_related("team"), pk=experiment_id
    )
    form = ImportForm(request.POST or None, request.FILES or None, experiment=experiment)
    status = 200
    if request.method == "POST":
        status = 422
        if refusal := uploads.refusal(request):
            form.is_valid()
            form.errors["file"] = form.error_class([refusal])
            status = 413
        elif form.is_valid():
            data = form.cleaned_data
            try:
                with uploads.staged(data["file"]) as path:
                    outcome = service.import_file(
                        experiment,
                        request.user,
                        data["tool"],
                        path,
                        service.Placement(data["preset"] or None, data["staleness"] or None, data["seed"]),
                        form.mapping_changes(),
                        run=data["run"] or None,
                    )
            except service.ImportRefused as exc:
                form.add_error(exc.field if exc.field in form.fields else None, exc.message)
            else:
                run = outcome.record.run
                if outcome.created:
                    messages.success(
                        request,
                        f"Imported {outcome.record.file_name} as run {run.pk} ({run.preset}, {run.staleness}, "
                        f"seed {run.seed}): read-only, compared as the lab's own runs are.",
                    )
                else:
                    messages.info(request, outcome.notes[0] + ".")
                return redirect("run-detail", run.pk)
    context = {
        "experiment": experiment,
        "form": form,
        "mappings": formats.DEFAULT_MAPPINGS,
        "max_bytes": settings.LAB_IMPORT_MAX_BYTES,
    }
    return render(request, "imports/import.html", context, status=status)
