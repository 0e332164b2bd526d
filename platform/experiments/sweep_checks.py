"""What is wrong with a submitted sweep, each problem named once by the field the submitter wrote
(`presets`, `staleness.sync_offset`, `staleness.async`, `axes.<field>`, `algorithm.params.<knob>`,
`execution.train_processes`): the checks `sweeps.expand` runs beside `RunConfig`'s own, as
(field, message) pairs."""

from __future__ import annotations

import math
from typing import Annotated, Any

from django.conf import settings
from pydantic import TypeAdapter, ValidationError

from rlcore import presets as rl_presets
from rlcore.config import RunConfig, StalenessCell, cell_label, error_list

# RunConfig nests a few levels at most (algorithm.params.<knob>); a submitted config or staleness
# setting nested deeper than this is refused before anything walks it recursively (Python's
# recursion limit is about a thousand frames).
MAX_DEPTH = 32

_PARAMS = "algorithm.params."  # where a knob lands in RunConfig
MAX_AXES = 4  # config fields varied besides presets, staleness and seeds
MAX_AXIS_VALUES = 16
# Fields with an axis of their own: varied there, not through `axes`.
_OWN_AXES = {
    "algorithm.preset": "presets",
    "seed": "seeds",
    "staleness": "staleness",
    "execution.mode": "staleness (a cell's mode)",
    "execution.max_staleness": "staleness (an async cell's bound)",
}


def axis_errors(axes: Any, knobs: rl_presets.KnobCheck) -> list[tuple[str, str]]:
    """What is wrong with `axes` itself: its shape, a field with an axis of its own, a value list
    that is empty, too long, repeats itself, holds no scalars or what jsonb cannot store, a knob a
    chosen preset (with the base config's own overrides) ignores, a knob value out of range
    (`knobs`: `check_knobs`)."""
    if not isinstance(axes, dict):
        return [
            ("axes", 'axes must map config fields to lists of values, e.g. {"optimizer.minibatches": [1, 4]}')
        ]
    errors = []
    if len(axes) > MAX_AXES:
        errors.append(
            ("axes", f"at most {MAX_AXES} config fields can be varied besides presets, staleness and seeds")
        )
    for name, values in axes.items():
        where = f"axes.{name}"
        own = next((axis for f, axis in _OWN_AXES.items() if name == f or name.startswith(f + ".")), None)
        if not isinstance(name, str) or not name or any(not part for part in name.split(".")):
            errors.append(
                ("axes", f"{name!r} is not a config field: write it dotted, e.g. optimizer.minibatches")
            )
        elif own is not None:
            errors.append((where, f"{name} has an axis of its own: vary it through {own}"))
        elif not isinstance(values, list) or not values:
            errors.append((where, f"{name} needs a list of at least one value (got {values!r})"))
        elif len(values) > MAX_AXIS_VALUES:
            errors.append((where, f"{name} lists {len(values)} values; at most {MAX_AXIS_VALUES}"))
        elif any(isinstance(v, dict | list) for v in values):
            errors.append((where, f"{name}'s values must be numbers, text, true/false or null, one per cell"))
        elif problem := unstorable(values):
            errors.append((where, problem))
        elif repeated := duplicates(values):
            errors.append((where, f"{', '.join(map(repr, repeated))} listed twice; list each value once"))
        elif name.startswith(_PARAMS):
            knob = name.removeprefix(_PARAMS)
            if knob in knobs.unknown:
                errors.append((where, knobs.unknown[knob]))
            elif without := knobs.ignored[knob]:
                errors.append(
                    (
                        where,
                        f"{knob} is not a knob of {', '.join(without)}: its runs would not differ; choose only presets that have it",
                    )
                )
            else:
                errors += [
                    (where, f"{name} = {value!r}: {why}") for value, why in knobs.refused_values.get(knob, [])
                ]
    return errors


def _overrides(base: Any) -> dict[str, Any]:
    """The base config's algorithm overrides (knob → value as submitted), {} where there are none."""
    algorithm = base.get("algorithm") if isinstance(base, dict) else None
    overrides = algorithm.get("params") if isinstance(algorithm, dict) else None
    return overrides if isinstance(overrides, dict) else {}


def check_knobs(base: Any, presets: list[str], axes: Any) -> rl_presets.KnobCheck:
    """The base config's algorithm overrides and the knobs `axes` varies, held to their rules and
    to the presets that read them, in one question to `rlcore.presets` (only what passes
    `axis_errors`'s own checks of an axis is reported from it)."""
    varied = {
        name.removeprefix(_PARAMS): values
        for name, values in (axes.items() if isinstance(axes, dict) else ())
        if isinstance(name, str) and name.startswith(_PARAMS) and isinstance(values, list)
    }
    return rl_presets.check_knobs(presets, _overrides(base), varied)


def same_cells(configs: list[RunConfig], variants: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Axis values that resolve to the same run (`2` and `"2"`, or a default written out): two cells
    of one grid that would train the same config."""
    seen: dict[str, dict[str, Any]] = {}
    errors = []
    for config, variant in zip(configs, variants, strict=True):
        key = config.model_dump_json()
        if key in seen and seen[key] != variant:
            names = [n for n in variant if variant[n] != seen[key].get(n)] or list(variant)
            for name in names:
                error = (
                    f"axes.{name}",
                    f"{name} = {seen[key][name]!r} and {name} = {variant[name]!r} make the same run; list each value once",
                )
                if error not in errors:
                    errors.append(error)
        seen.setdefault(key, variant)
    return errors


def too_deep(value: Any) -> bool:
    """Whether `value` nests mappings and lists more than MAX_DEPTH levels deep (without recursion)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        if depth > MAX_DEPTH:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def depth_error(what: str) -> str:
    return f"{what} is nested more than {MAX_DEPTH} levels deep; the maximum depth is {MAX_DEPTH}"


def unstorable(value: Any) -> str | None:
    """Why `value` cannot be stored as PostgreSQL jsonb, or None if it can."""
    if isinstance(value, str) and "\x00" in value:
        return "text in the config must not contain NUL characters (\\u0000)"
    if isinstance(value, float) and not math.isfinite(value):
        return f"numbers in the config must be finite (got {value})"
    children = [*value.keys(), *value.values()] if isinstance(value, dict) else value
    if isinstance(children, list):
        return next((problem for child in children if (problem := unstorable(child))), None)
    return None


def duplicates(values: list[Any]) -> list[Any]:
    seen: list[Any] = []
    repeated: list[Any] = []
    for value in values:
        if value in seen and value not in repeated:
            repeated.append(value)
        seen.append(value)
    return repeated


def _described(setting: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in setting.items()) or "on-policy"


def staleness_field(setting: dict[str, Any]) -> str:
    """The submitted field a staleness setting came from (the form shows each kind in its own box)."""
    if setting.get("mode") == "async" or "max_staleness" in setting:
        return "staleness.async"
    if setting.get("offline"):
        return "staleness.offline"
    for key in ("sync_offset", "sync_interval"):
        if key in setting:
            return f"staleness.{key}"
    return "staleness"


def _valid_steps(steps: Any) -> int | None:
    """`steps` if it keeps the field's own rule (a whole number within RunConfig's bounds), else None:
    a rule that combines fields is checked only on fields that are valid on their own."""
    field = RunConfig.model_fields["steps"]
    try:
        return TypeAdapter(Annotated[int, *field.metadata]).validate_python(steps)
    except ValidationError:
        return None


def cells(staleness: list[dict[str, Any]]) -> tuple[list[StalenessCell | None], list[tuple[str, str]]]:
    """Each staleness setting as a cell (None where it is not one), and why each such is not."""
    cells: list[StalenessCell | None] = []
    errors: list[tuple[str, str]] = []
    for setting in staleness:
        try:
            cells.append(StalenessCell.model_validate(setting))
        except ValidationError as exc:
            cells.append(None)
            for dotted, message in error_list(exc):
                if dotted in ("mode", "max_staleness"):
                    error = (staleness_field(setting), f"{dotted}: {message}")
                elif dotted == "config":  # a rule of the whole cell
                    error = (staleness_field(setting), message)
                else:
                    error = (f"staleness.{dotted}", message)
                if error not in errors:
                    errors.append(error)
    return cells, errors


def staleness_errors(
    staleness: list[dict[str, Any]], cells: list[StalenessCell | None], base: dict[str, Any], steps: Any
) -> list[tuple[str, str]]:
    """Cells that repeat another one (the same schedule in the same mode, or the same async bound),
    or that never leave θ₀ within `steps` (offline in disguise).

    Settings that are no cell are reported by `cells`; the rule about `steps` is left to RunConfig
    while `steps` itself is not valid (RunConfig names its own error)."""
    steps = _valid_steps(steps)
    execution = base.get("execution") if isinstance(base.get("execution"), dict) else {}
    errors = []
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for setting, cell in zip(staleness, cells, strict=True):
        if cell is None:
            continue
        resolved = cell.schedule
        cell_execution = cell.execution(execution)
        mode = cell_execution.get("mode", "simulated")
        bound = cell_execution.get("max_staleness", 1) if mode == "async" else None
        # (A schedule in an async sweep is refused by RunConfig, saying why.)
        label = resolved.label if mode == "async" and resolved.label != "on-policy" else None
        label = label or cell_label(mode, resolved.label, bound)
        field = staleness_field(setting)
        key = (mode, resolved, bound)
        if key in seen:
            first = seen[key]
            same = "is listed twice" if first == setting else f"is the same setting as {_described(first)}"
            errors.append((field, f"{_described(setting)} {same} ({label}); list each setting once"))
            continue
        seen[key] = setting
        k, d = resolved.sync_interval, resolved.sync_offset
        if not resolved.offline and steps is not None and (k, d) != (1, 0) and k + d >= steps:
            what = f"sync_offset {d}" if d else f"sync_interval {k}"
            errors.append(
                (
                    field,
                    f"{what} with {steps} steps would make an offline run: v(t) = k·max(0, ⌊(t − d − 1)/k⌋) "
                    f"is 0 for every step t ≤ {steps} when k + d ≥ steps (here k = {k}, d = {d}); use offline",
                )
            )
    return errors


def knob_errors(base: dict[str, Any], knobs: rl_presets.KnobCheck) -> list[tuple[str, str]]:
    """Algorithm overrides that are invalid, or that a chosen preset's loss does not read."""
    overrides = _overrides(base)
    errors = [(f"{_PARAMS}{knob}", knobs.refused[knob]) for knob in overrides if knob in knobs.refused]
    for knob in overrides:
        without = knobs.ignored.get(knob) if knob not in knobs.refused else None
        if without:
            its = "its" if len(without) == 1 else "their"
            errors.append(
                (
                    f"{_PARAMS}{knob}",
                    f"{knob} is not a knob of {', '.join(without)}: {its} loss does not read it; "
                    "leave it blank or choose only presets that have it",
                )
            )
    return errors


TRAIN_PROCESSES = "execution.train_processes"


def train_process_errors(configs: list[RunConfig], variants: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Cells with more trainer processes than `LAB_MAX_TRAIN_PROCESSES`, in any execution mode;
    named `axes.execution.train_processes` where that axis set the value. What the live workers
    of the queue have is checked apart (`execution.models.Worker.train_process_problems`)."""
    cap = settings.LAB_MAX_TRAIN_PROCESSES
    errors = []
    for config, variant in zip(configs, variants, strict=True):
        n = config.execution.train_processes
        if n <= cap:
            continue
        field = f"axes.{TRAIN_PROCESSES}" if TRAIN_PROCESSES in variant else TRAIN_PROCESSES
        error = (
            field,
            f"{TRAIN_PROCESSES} = {n}: at most {cap} trainer processes per run (LAB_MAX_TRAIN_PROCESSES)",
        )
        if error not in errors:
            errors.append(error)
    return errors
