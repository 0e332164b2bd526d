"""The sweep form and the save-as-template form: the page's grouping of the fields, the grid's own
boxes (staleness, seeds, other axes) and the built-in templates. The run fields are generated from
`RunConfig.model_json_schema()` (`run_fields`) and the grid is validated by `sweeps.expand`: no
bounds are checked here."""

from __future__ import annotations

import copy
import json
from typing import Any

from django import forms

from accounts.models import Team
from execution.models import Worker
from experiments import sweeps
from experiments.models import Run
from experiments.run_fields import run_parameter_fields
from rlcore.config import SCHEDULE_MODES, StalenessConfig
from rlcore.presets import PRESETS

# Grid-axis errors from RunConfig, and the form field that shows them.
AXIS_ERROR_FIELDS = {
    "staleness": "on_policy",
    "staleness.sync_interval": "sync_intervals",
    "staleness.sync_offset": "sync_offsets",
    "staleness.offline": "offline",
    "staleness.async": "async_bounds",
    "execution": "execution.mode",
    "mirror.mlflow_uri": "mirror_mlflow_uri",
    "mirror.tensorboard": "mirror_tensorboard",
}


def _staleness_help(name: str) -> str:
    return StalenessConfig.model_fields[name].description or ""


def parse_axes(text: str) -> dict[str, list[Any]]:
    """The "Other axes" box: `field: v1, v2` per line. A value reads as JSON where it is one
    (4, 0.5, true, null), else as text (bfloat16)."""
    axes: dict[str, list[Any]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        name, colon, values = line.partition(":")
        name = name.strip()
        if not colon or not name or not values.strip():
            raise forms.ValidationError(
                f"line {number}: write a config field, a colon and its values, e.g. optimizer.minibatches: 1, 4 "
                f"(got {line.strip()!r})",
                code="invalid",
            )
        if name in axes:
            raise forms.ValidationError(
                f"line {number}: {name} is listed twice; give it one line", code="invalid"
            )
        axes[name] = [_axis_value(part.strip()) for part in values.split(",") if part.strip()]
    return axes


def _axis_value(text: str) -> Any:
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if not isinstance(value, dict | list) else text


def axes_text(axes: dict[str, list[Any]]) -> str:
    """`parse_axes`'s inverse, for a cloned sweep."""
    return "\n".join(
        f"{name}: {', '.join(json.dumps(v) if not isinstance(v, str) else v for v in values)}"
        for name, values in axes.items()
    )


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


# Starting points for the form (`?template=<name>` on the new-sweep page): initial values only,
# validated like anything typed. "cpu-demo" is docs/algorithms.md §10's demo grid, where the paper's
# effects show on 2 CPU cores.
TEMPLATES = {
    "cpu-demo": {
        "name": "CPU demo: 4 presets × 4 staleness settings",
        "presets": ["reinforce", "grpo", "rec-oneside-nois", "rec-oneside-nois-wide"],
        "on_policy": True,
        "sync_intervals": "48",
        "sync_offsets": "8",
        "offline": True,
        "seeds": "0, 1",
        "optimizer.lr": 3e-5,
        "rollout.prompts_per_step": 16,
        "rollout.group_size": 8,
        "steps": 150,
    },
    "field-losses": {
        "name": "The field's losses under staleness",
        "presets": [
            "grpo",
            "rec-oneside-nois",
            "decoupled-ppo",
            "grpo-tis",
            "m2po",
            "cispo",
            "sapo",
            "dppo-tv",
            "icepop",
            "kpop",
            "trm",
            "dppo-kl",
            "ce-gppo",
            "dro",
            "bapo",
        ],
        "on_policy": True,
        "sync_offsets": "8",
        "offline": True,
        "seeds": "0, 1, 2",
        "optimizer.lr": 3e-5,
        "optimizer.minibatches": 4,
        "rollout.prompts_per_step": 16,
        "rollout.group_size": 8,
        "steps": 150,
    },
}


def initial_from_spec(spec: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The form's initial values for a stored sweep (`Experiment.spec`, a saved template): what
    "Clone this experiment" and a team's templates fill the form with; and the parts of the sweep
    the form cannot show (a setting combining sync_interval and sync_offset, a config field that
    is no scalar run parameter), each as a warning to submit that part through the API."""
    initial: dict[str, Any] = {"presets": list(spec.get("presets", [])), "on_policy": False}
    warnings: list[str] = []
    intervals, offsets, bounds = [], [], []
    base_mode = spec.get("config", {}).get("execution", {}).get("mode", "simulated")
    cells = list(spec.get("staleness", []))
    # Every schedule in both modes, as "Each schedule both simulated and distributed" wrote it.
    schedules = [c for c in cells if c.get("mode") != "async"]
    by_mode = {
        m: [{k: v for k, v in c.items() if k != "mode"} for c in schedules if c.get("mode") == m]
        for m in SCHEDULE_MODES
    }
    if (
        schedules
        and len(schedules) == 2 * len(by_mode["simulated"])
        and by_mode["simulated"] == by_mode["distributed"]
    ):
        initial["both_modes"] = True
        cells = [*by_mode["simulated"], *(c for c in cells if c.get("mode") == "async")]
    for setting in cells:
        if setting.get("mode") == "async" and set(setting) <= {"mode", "max_staleness"}:
            bounds.append(setting.get("max_staleness", 1))
            continue
        if setting.get("mode") == base_mode:  # the sweep's own mode, written out
            setting = {k: v for k, v in setting.items() if k != "mode"}
        keys = set(setting)
        if not keys:
            initial["on_policy"] = True
        elif keys == {"sync_interval"}:
            intervals.append(setting["sync_interval"])
        elif keys == {"sync_offset"}:
            offsets.append(setting["sync_offset"])
        elif keys == {"offline"} and setting["offline"]:
            initial["offline"] = True
        elif "mode" in keys:
            warnings.append(
                f"the staleness cell {setting} runs {setting['mode']}, and the form runs every schedule "
                f"cell in the sweep's mode ({base_mode}); submit it through the API"
            )
        else:
            warnings.append(
                f"the staleness setting {setting} combines fields the form sets apart; submit it through the API"
            )
    initial["sync_intervals"] = ", ".join(map(str, intervals))
    initial["sync_offsets"] = ", ".join(map(str, offsets))
    initial["async_bounds"] = ", ".join(map(str, bounds))
    initial["seeds"] = ", ".join(map(str, spec.get("seeds", [])))
    initial["serial"] = bool(spec.get("serial", False))
    mirror = spec.get("mirror") or {}
    initial["mirror_mlflow_uri"] = mirror.get("mlflow_uri", "")
    if "tensorboard" in mirror:
        initial["mirror_tensorboard"] = "on" if mirror["tensorboard"] else "off"
    initial["axes"] = axes_text(spec.get("axes", {}))
    known = {param.path for param, _ in run_parameter_fields()}

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, value in node.items():
            path = f"{prefix}{key}"
            if isinstance(value, dict) and path not in known:
                walk(value, path + ".")
            elif path in known:
                initial[path] = value
            else:
                warnings.append(f"the config field {path} is not on the form; submit it through the API")

    walk(spec.get("config", {}), "")
    return initial, warnings


class SweepForm(forms.Form):
    name = forms.CharField(max_length=200)
    team = forms.ModelChoiceField(queryset=Team.objects.none(), empty_label=None)
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)
    presets = forms.MultipleChoiceField(
        choices=[(p, p) for p in PRESETS],
        widget=forms.CheckboxSelectMultiple,
        help_text="none ticked on a blank form: the sweep runs exactly the presets you tick",
    )
    on_policy = forms.BooleanField(
        required=False,
        initial=True,
        label="On-policy",
        help_text="k = 1, d = 0: step t trains on a batch from the current policy, v(t) = t − 1",
    )
    sync_intervals = forms.CharField(
        required=False,
        label="Sync intervals",
        help_text=f"{_staleness_help('sync_interval')}. E.g. 20, 48: one run setting per value",
    )
    sync_offsets = forms.CharField(
        required=False,
        label="Sync offsets",
        help_text=f"{_staleness_help('sync_offset')}. E.g. 8, 32: one run setting per value",
    )
    offline = forms.BooleanField(required=False, label="Offline", help_text=_staleness_help("offline"))
    both_modes = forms.BooleanField(
        required=False,
        label="Each schedule both simulated and distributed",
        help_text=(
            "two cells per schedule: one simulated, one on rollout workers (labelled (distributed)); the same "
            "numbers, for what running apart costs or saves in wall-clock"
        ),
    )
    async_bounds = forms.CharField(
        required=False,
        label="Async bounds",
        help_text=(
            "k: async cells beside the schedules, run on rollout workers that generate with the newest "
            "weights, no batch more than k versions behind (their lag is measured). E.g. 1, 4: one "
            "cell per value"
        ),
    )
    seeds = forms.CharField(initial="0", label="Seeds", help_text="e.g. 0, 1, 2: one run per value")
    axes = forms.CharField(
        required=False,
        label="Other axes",
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "optimizer.minibatches: 1, 4"}),
        help_text=(
            "one config field per line with the values to try, e.g. optimizer.minibatches: 1, 4 or "
            "rollout.dtype: same, bfloat16 or algorithm.params.anchor: behaviour, proximal, loglinear; every "
            "combination is a cell, crossed with the presets, staleness settings and seeds"
        ),
    )
    serial = forms.BooleanField(
        required=False,
        label="Measure one at a time",
        help_text=(
            "each run starts only when no other run is running, and no other run starts while it runs: "
            "slower, but its throughput and speed-ups are the runs', not the machine's load"
        ),
    )

    mirror_mlflow_uri = forms.CharField(
        required=False,
        max_length=500,
        label="Mirror to MLflow",
        help_text=(
            "every run's config and metrics also sent to this MLflow tracking server (http(s)://host:port); "
            "empty: the team's setting"
        ),
    )
    mirror_tensorboard = forms.ChoiceField(
        required=False,
        choices=[("", "the team's setting"), ("on", "on"), ("off", "off")],
        label="TensorBoard files",
        help_text="every run's metrics also written as TensorBoard event files under its folder",
    )

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
        return [
            self[name]
            for name in (
                "on_policy",
                "sync_intervals",
                "sync_offsets",
                "offline",
                "both_modes",
                "async_bounds",
            )
        ]

    def preset_families(self) -> list[tuple[str, list[tuple[Any, str]]]]:
        """The presets' checkboxes grouped by family, each with the line saying what it is."""
        grouped: dict[str, list[tuple[Any, str]]] = {}
        for option in self["presets"]:
            preset = PRESETS[option.data["value"]]
            grouped.setdefault(preset.family, []).append((option, preset.description))
        return list(grouped.items())

    def task_kind(self) -> str:
        return str(self["task.name"].value())

    def param_sections(self) -> list[tuple[str, list[tuple[forms.BoundField, str, bool]]]]:
        """Run-parameter fields grouped by config section, for the template: (field, the task
        kinds it belongs to or "" for all, whether it is hidden for the chosen task kind)."""
        sections: dict[str, list[tuple[forms.BoundField, str, bool]]] = {}
        for param in self.params:
            kinds = " ".join(sorted(param.variants or ()))
            hidden = param.variants is not None and self.task_kind() not in param.variants
            sections.setdefault(param.section_title, []).append((self[param.path], kinds, hidden))
        return list(sections.items())

    def error_summary(self) -> list[tuple[str, str, str]]:
        """(anchor id or "", label, message) for every error, in the order of the form."""
        out = [("", "", message) for message in self.non_field_errors()]
        for bound in self:
            anchor = bound.id_for_label or bound.auto_id
            out.extend((anchor, str(bound.label), message) for message in bound.errors)
        return out

    def summary_line(self) -> str:
        """What the checked sweep will queue, with the values that take effect, e.g. "This sweep
        makes 18 runs × 150 steps (default), lr 3e-05 (default)." """
        if self.sweep is None:
            return ""
        config = self.sweep.configs[0]
        base = self.sweep.base
        steps = f"{config.steps} steps{'' if 'steps' in base else ' (default)'}"
        typed_lr = "lr" in base.get("optimizer", {})
        lr = f"lr {config.optimizer.lr:g}{'' if typed_lr else ' (default)'}"
        size = self.sweep.size
        return f"This sweep makes {size} run{'s' if size != 1 else ''} × {steps}, {lr}."

    def clean_sync_intervals(self) -> list[int]:
        return _int_list(self.cleaned_data["sync_intervals"], "sync intervals")

    def clean_sync_offsets(self) -> list[int]:
        return _int_list(self.cleaned_data["sync_offsets"], "sync offsets")

    def clean_async_bounds(self) -> list[int]:
        return _int_list(self.cleaned_data["async_bounds"], "async bounds")

    def clean_seeds(self) -> list[int]:
        return _int_list(self.cleaned_data["seeds"], "seeds")

    def clean_axes(self) -> dict[str, list[Any]]:
        return parse_axes(self.cleaned_data["axes"])

    def mirror_spec(self) -> dict[str, Any]:
        """The sweep's mirroring over its team's (`imports.mirror`): only what the form sets."""
        data = self.cleaned_data
        mirror: dict[str, Any] = {}
        if data.get("mirror_mlflow_uri"):
            mirror["mlflow_uri"] = data["mirror_mlflow_uri"]
        if data.get("mirror_tensorboard"):
            mirror["tensorboard"] = data["mirror_tensorboard"] == "on"
        return mirror

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
        if data.get("both_modes"):
            settings = [{**s, "mode": mode} for s in settings for mode in SCHEDULE_MODES]
        settings += [{"mode": "async", "max_staleness": k} for k in data.get("async_bounds", [])]
        return settings

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        for param in self.params:
            if param.variants is not None and data.get("task.name") not in param.variants:
                self.errors.pop(param.path, None)  # another task kind's field, hidden and ignored
        if self.errors:
            return data
        try:
            self.sweep = sweeps.expand(
                self.base_config(),
                data["presets"],
                self.staleness_settings(),
                data["seeds"],
                bool(data.get("serial")),
                data.get("axes") or {},
                self.mirror_spec(),
            )
            # Not an error: runs wait in their queue until a worker starts.
            self.queue_warnings = Worker.missing_for(self.sweep.configs)
            if refusal := Run.queued_cap_refusal(data["team"], self.sweep.size):
                self.add_error("team", refusal)
        except sweeps.SweepError as exc:
            self.add_sweep_errors(exc)
        return data

    def add_sweep_errors(self, exc: sweeps.SweepError) -> None:
        """Show each of the sweep's problems next to the field it concerns."""
        for field, message in exc.errors:
            field = "axes" if field.split(".")[0] == "axes" else AXIS_ERROR_FIELDS.get(field, field)
            if field in self.fields:
                self.add_error(field, message)
            else:
                self.add_error(None, f"{field}: {message}")


class TemplateForm(forms.Form):
    name = forms.CharField(max_length=200, label="Template name", strip=True)
