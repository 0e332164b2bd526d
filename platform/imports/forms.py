"""The import form on an experiment's page: the file, the tool that wrote it, where the run goes in
the grid (preset, staleness cell, seed: blank takes the file's config's) and changes to the tool's
mapping of metric names. The rules live in `imports.service` (and `RunConfig`), which names the
field a refusal is about; the form only gives the fields their kinds."""

from __future__ import annotations

from django import forms

from experiments.models import Experiment
from imports import formats, service
from rlcore.presets import PRESETS


class ImportForm(forms.Form):
    file = forms.FileField(help_text="the run's file as its tool wrote it")
    tool = forms.ChoiceField(choices=[(tool, tool) for tool in formats.TOOLS])
    preset = forms.ChoiceField(required=False, help_text="—: the file's config's")
    staleness = forms.CharField(
        required=False,
        max_length=100,
        help_text=f"a cell of this experiment, or any of {service.STALENESS_SYNTAX}; blank: the file's config's",
    )
    seed = forms.IntegerField(required=False, help_text="blank: the file's config's")
    run = forms.CharField(
        required=False,
        max_length=200,
        help_text="the run to read, in a file that holds several (a Trackio project)",
    )
    mapping = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 4, "cols": 60, "placeholder": "eval/acc=eval/accuracy"}),
        help_text="changes to the tool's mapping below, one source_name=lab_name a line; a name the mapping "
        "leaves out is stored as imported/<name>",
    )

    def __init__(self, *args, experiment: Experiment, **kwargs):
        super().__init__(*args, **kwargs)
        ours = list(dict.fromkeys(experiment.spec.get("presets", [])))
        self.fields["preset"].choices = [
            ("", "—"),
            *((p, p) for p in ours + [p for p in PRESETS if p not in ours]),
        ]
        self.cells = list(service.cell_labels(experiment))
        self.fields["staleness"].widget.attrs["list"] = "staleness-cells"
        if self.cells:
            self.fields["staleness"].initial = self.cells[0]
        if ours:
            self.fields["preset"].initial = ours[0]

    def mapping_changes(self) -> dict[str, str]:
        """The mapping lines as {source: lab}; `service.ImportRefused` (field `mapping`) for a bad line."""
        return service.parse_mapping(
            [line for line in self.cleaned_data["mapping"].splitlines() if line.strip()]
        )
