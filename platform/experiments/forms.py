"""Forms: submit a sweep, create a team, add a member.

The sweep form has no list of run parameters of its own: its run-parameter fields are
generated from `RunConfig.model_json_schema()` (names are dotted config paths such as
`rollout.group_size`, labels, help and initial values come from the schema), and the whole
grid is validated by `sweeps.expand`, i.e. by `RunConfig`. Bounds are never checked here;
RunConfig's messages come back next to the field they concern.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib.auth import get_user_model

from experiments import sweeps
from experiments.models import Team, Worker
from rlcore.config import RunConfig
from rlcore.presets import preset_names

# Set per run by the grid, so not run-parameter fields of the form.
GRID_AXES = ("algorithm", "staleness", "seed")
# Grid-axis errors from RunConfig, and the form field that shows them.
AXIS_ERROR_FIELDS = {"staleness.sync_interval": "sync_intervals", "staleness.sync_offset": "sync_offsets"}


@dataclass(frozen=True)
class ParamField:
    """One scalar leaf of RunConfig; `variants` restricts a task field to the task kinds that have it."""

    path: str
    node: dict[str, Any]
    section: str
    variants: frozenset[str] | None = None


def _deref(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        return {
            **schema["$defs"][node["$ref"].rsplit("/", 1)[1]],
            **{k: v for k, v in node.items() if k != "$ref"},
        }
    return node


def _leaves(schema: dict[str, Any], node: dict[str, Any], prefix: str, section: str) -> list[ParamField]:
    out = []
    for name, prop in node["properties"].items():
        path = f"{prefix}{name}"
        if path in GRID_AXES:
            continue
        prop = _deref(schema, prop)
        if "discriminator" in prop:
            key = prop["discriminator"]["propertyName"]
            out.append(ParamField(f"{path}.{key}", {"enum": list(prop["discriminator"]["mapping"])}, path))
            by_path: dict[str, ParamField] = {}
            for variant_name, ref in prop["discriminator"]["mapping"].items():
                variant = _deref(schema, {"$ref": ref})
                for leaf in _leaves(schema, variant, f"{path}.", path):
                    if leaf.path == f"{path}.{key}":
                        continue
                    seen = by_path.get(leaf.path)
                    kinds = (seen.variants if seen else frozenset()) | {variant_name}
                    by_path[leaf.path] = ParamField(leaf.path, (seen or leaf).node, path, kinds)
            every_kind = frozenset(prop["discriminator"]["mapping"])
            out.extend(
                ParamField(leaf.path, leaf.node, path, None if leaf.variants == every_kind else leaf.variants)
                for leaf in by_path.values()
            )
        elif "properties" in prop:
            out.extend(_leaves(schema, prop, f"{path}.", path))
        else:
            out.append(ParamField(path, prop, section))
    return out


_FIELD_CLASSES = {
    "integer": forms.IntegerField,
    "number": forms.FloatField,
    "string": forms.CharField,
    "boolean": forms.BooleanField,
}


def _form_field(param: ParamField) -> forms.Field | None:
    """A blank-allowed form field for one scalar leaf (None for lists and mappings)."""
    options = [n for n in param.node.get("anyOf", [param.node]) if n.get("type") != "null"]
    if len(options) != 1:
        return None
    kind = options[0]
    help_text = param.node.get("description", "")
    if param.variants is not None:
        help_text = f"{help_text} (only for {' / '.join(sorted(param.variants))})".strip()
    common = {"required": False, "help_text": help_text}
    if "enum" in kind:
        initial = param.node.get("default", kind["enum"][0])
        return forms.ChoiceField(choices=[(v, v) for v in kind["enum"]], initial=initial, **common)
    field_class = _FIELD_CLASSES.get(kind.get("type"))
    if field_class is None:
        return None
    if field_class is forms.BooleanField:
        return field_class(initial=param.node.get("default"), **common)
    # A blank box means "RunConfig's default", which the placeholder shows.
    default = param.node.get("default")
    placeholder = "" if default is None else str(default).replace("\n", "\\n")
    return field_class(widget=field_class.widget(attrs={"placeholder": placeholder}), **common)


@functools.cache
def run_parameter_fields() -> tuple[tuple[ParamField, forms.Field], ...]:
    """The scalar run parameters a person can set on the form, in schema order, with their fields."""
    schema = RunConfig.model_json_schema()
    pairs = ((param, _form_field(param)) for param in _leaves(schema, schema, "", "run"))
    return tuple((param, field) for param, field in pairs if field is not None)


def _int_list(text: str, what: str) -> list[int]:
    values = []
    for part in text.replace(",", " ").split():
        try:
            values.append(int(part))
        except ValueError:
            raise forms.ValidationError(
                f"{what} must be whole numbers separated by commas (got {part!r})", code="invalid"
            ) from None
    return values


class SweepForm(forms.Form):
    name = forms.CharField(max_length=200)
    team = forms.ModelChoiceField(queryset=Team.objects.none(), empty_label=None)
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)
    presets = forms.MultipleChoiceField(
        choices=[(p, p) for p in preset_names()],
        widget=forms.CheckboxSelectMultiple,
        initial=["rec-oneside-nois"],
    )
    on_policy = forms.BooleanField(required=False, initial=True, label="on-policy")
    sync_intervals = forms.CharField(required=False, help_text="e.g. 20, 48: one run setting per value")
    sync_offsets = forms.CharField(required=False, help_text="e.g. 8, 32: one run setting per value")
    offline = forms.BooleanField(required=False, help_text="every batch from the initial policy")
    seeds = forms.CharField(initial="0", help_text="e.g. 0, 1, 2")

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["team"].queryset = Team.objects.filter(members=user)
        self.params = [param for param, _ in run_parameter_fields()]
        for param, field in run_parameter_fields():
            self.fields[param.path] = copy.deepcopy(field)
        self.sweep: sweeps.Sweep | None = None
        self.queue_warnings: list[str] = []

    def experiment_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in ("name", "team", "description")]

    def staleness_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in ("on_policy", "sync_intervals", "sync_offsets", "offline")]

    def param_sections(self) -> list[tuple[str, list[forms.BoundField]]]:
        """Run-parameter fields grouped by config section, for the template."""
        sections: dict[str, list[forms.BoundField]] = {}
        for param in self.params:
            sections.setdefault(param.section, []).append(self[param.path])
        return list(sections.items())

    def clean_sync_intervals(self) -> list[int]:
        return _int_list(self.cleaned_data["sync_intervals"], "sync intervals")

    def clean_sync_offsets(self) -> list[int]:
        return _int_list(self.cleaned_data["sync_offsets"], "sync offsets")

    def clean_seeds(self) -> list[int]:
        return _int_list(self.cleaned_data["seeds"], "seeds")

    def base_config(self) -> dict[str, Any]:
        """The submitted run parameters as a nested config; blanks fall back to RunConfig's defaults."""
        data = self.cleaned_data
        task_kind = data.get("task.name")
        base: dict[str, Any] = {}
        for param in self.params:
            value = data.get(param.path)
            if value is None or value == "":
                continue
            if param.variants is not None and task_kind not in param.variants:
                continue
            *parents, leaf = param.path.split(".")
            node = base
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        return base

    def staleness_settings(self) -> list[dict[str, Any]]:
        data = self.cleaned_data
        settings = [{}] if data.get("on_policy") else []
        settings += [{"sync_interval": k} for k in data.get("sync_intervals", [])]
        settings += [{"sync_offset": d} for d in data.get("sync_offsets", [])]
        if data.get("offline"):
            settings.append({"offline": True})
        return settings

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if self.errors:
            return data
        try:
            self.sweep = sweeps.expand(
                self.base_config(), data["presets"], self.staleness_settings(), data["seeds"]
            )
            # Not an error: runs wait in their queue until a worker starts.
            self.queue_warnings = Worker.missing_for(self.sweep.configs)
        except sweeps.SweepError as exc:
            for field, message in exc.errors:
                field = AXIS_ERROR_FIELDS.get(field, field)
                if field == "staleness":
                    field = "on_policy"
                if field in self.fields:
                    self.add_error(field, message)
                else:
                    self.add_error(None, f"{field}: {message}")
        return data


class TeamForm(forms.ModelForm):
    class Meta:
        model = Team
        fields = ["name"]


class AddMemberForm(forms.Form):
    username = forms.CharField(max_length=150)
    is_admin = forms.BooleanField(required=False, label="team admin")

    def clean_username(self):
        username = self.cleaned_data["username"]
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None:
            raise forms.ValidationError(f"no active user is called {username!r}; check the spelling")
        return user
