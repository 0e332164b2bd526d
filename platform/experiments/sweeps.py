"""A sweep: one base run config crossed with presets × staleness cells × seeds × any other config
fields' value lists (`axes`, e.g. `{"optimizer.minibatches": [1, 4]}`: each combination is a cell,
its values the run's `variant`). A staleness cell is a schedule run simulated or distributed, or
an async cell with its bound (`StalenessCell`), so execution is an axis of the grid beside staleness. `expand` validates every cell through
`RunConfig` and names each problem once by the field the submitter wrote (`presets`,
`staleness.sync_offset`, `staleness.async`, `rollout.group_size`); `create_experiment` refuses a
sweep over `LAB_TEAM_MAX_QUEUED` and sends the runs' messages after the transaction commits."""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Annotated, Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from pydantic import TypeAdapter, ValidationError

from accounts.models import Membership, Team
from execution.models import Worker
from experiments.models import Experiment, Run, queued_cap_refusal, validation_context
from rlcore import presets as rl_presets
from rlcore.config import RunConfig, StalenessCell, cell_label, error_list

# RunConfig nests a few levels at most (algorithm.params.<knob>); a submitted config or staleness
# setting nested deeper than this is refused before anything walks it recursively (Python's
# recursion limit is about a thousand frames).
MAX_DEPTH = 32

# Where a grid axis lands in RunConfig, and the name the submitter used for it.
_AXIS_FIELDS = {"algorithm.preset": "presets", "seed": "seeds"}
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


class SweepError(ValueError):
    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = errors
        super().__init__("; ".join(f"{name}: {message}" for name, message in errors))


@dataclass(frozen=True)
class Sweep:
    base: dict[str, Any]
    presets: list[str]
    staleness: list[dict[str, Any]]
    seeds: list[int]
    configs: list[RunConfig] = field(default_factory=list)
    # Measured one at a time: each run starts only when no other run is running, and no other
    # starts while it runs (`Run.claim_next`), so that its throughput means something.
    serial: bool = False
    axes: dict[str, list[Any]] = field(default_factory=dict)
    variants: list[dict[str, Any]] = field(default_factory=list)  # per config: its axes' values

    @property
    def size(self) -> int:
        return (
            len(self.presets)
            * len(self.staleness)
            * len(self.seeds)
            * math.prod(map(len, self.axes.values()))
        )

    def as_spec(self) -> dict[str, Any]:
        return {
            "config": self.base,
            "presets": self.presets,
            "staleness": self.staleness,
            "seeds": self.seeds,
            **({"axes": self.axes} if self.axes else {}),
            **({"serial": True} if self.serial else {}),
        }


def _set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `data[a][b][c] = value` for "a.b.c", making (or replacing non-mapping) sections on the way."""
    *sections, leaf = dotted.split(".")
    node = data
    for key in sections:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[leaf] = value


def _axis_errors(axes: Any, knobs: rl_presets.KnobCheck) -> list[tuple[str, str]]:
    """What is wrong with `axes` itself: its shape, a field with an axis of its own, a value list
    that is empty, too long, repeats itself, holds no scalars or what jsonb cannot store, a knob a
    chosen preset (with the base config's own overrides) ignores, a knob value out of range
    (`knobs`: `_check_knobs`)."""
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
        elif problem := _unstorable(values):
            errors.append((where, problem))
        elif repeated := _duplicates(values):
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


def _check_knobs(base: Any, presets: list[str], axes: Any) -> rl_presets.KnobCheck:
    """The base config's algorithm overrides and the knobs `axes` varies, held to their rules and
    to the presets that read them, in one question to `rlcore.presets` (only what passes
    `_axis_errors`'s own checks of an axis is reported from it)."""
    varied = {
        name.removeprefix(_PARAMS): values
        for name, values in (axes.items() if isinstance(axes, dict) else ())
        if isinstance(name, str) and name.startswith(_PARAMS) and isinstance(values, list)
    }
    return rl_presets.check_knobs(presets, _overrides(base), varied)


def _same_cells(configs: list[RunConfig], variants: list[dict[str, Any]]) -> list[tuple[str, str]]:
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


def _variants(axes: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the axes' values, in order (the last axis varies fastest)."""
    names = list(axes)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(axes[n] for n in names))]


def _submitted_name(dotted: str) -> str:
    for prefix, name in _AXIS_FIELDS.items():
        if dotted == prefix or dotted.startswith(prefix + "."):
            return name
    return dotted


def _too_deep(value: Any) -> bool:
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


def _depth_error(what: str) -> str:
    return f"{what} is nested more than {MAX_DEPTH} levels deep; the maximum depth is {MAX_DEPTH}"


def _unstorable(value: Any) -> str | None:
    """Why `value` cannot be stored as PostgreSQL jsonb, or None if it can."""
    if isinstance(value, str) and "\x00" in value:
        return "text in the config must not contain NUL characters (\\u0000)"
    if isinstance(value, float) and not math.isfinite(value):
        return f"numbers in the config must be finite (got {value})"
    children = [*value.keys(), *value.values()] if isinstance(value, dict) else value
    if isinstance(children, list):
        return next((problem for child in children if (problem := _unstorable(child))), None)
    return None


def _duplicates(values: list[Any]) -> list[Any]:
    seen: list[Any] = []
    repeated: list[Any] = []
    for value in values:
        if value in seen and value not in repeated:
            repeated.append(value)
        seen.append(value)
    return repeated


def _described(setting: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in setting.items()) or "on-policy"


def _staleness_field(setting: dict[str, Any]) -> str:
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


def _cells(staleness: list[dict[str, Any]]) -> tuple[list[StalenessCell | None], list[tuple[str, str]]]:
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
                    error = (_staleness_field(setting), f"{dotted}: {message}")
                elif dotted == "config":  # a rule of the whole cell
                    error = (_staleness_field(setting), message)
                else:
                    error = (f"staleness.{dotted}", message)
                if error not in errors:
                    errors.append(error)
    return cells, errors


def _staleness_errors(
    staleness: list[dict[str, Any]], cells: list[StalenessCell | None], base: dict[str, Any], steps: Any
) -> list[tuple[str, str]]:
    """Cells that repeat another one (the same schedule in the same mode, or the same async bound),
    or that never leave θ₀ within `steps` (offline in disguise).

    Settings that are no cell are reported by `_cells`; the rule about `steps` is left to RunConfig
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
        field = _staleness_field(setting)
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


def _knob_errors(base: dict[str, Any], knobs: rl_presets.KnobCheck) -> list[tuple[str, str]]:
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


def expand(
    base: dict[str, Any],
    presets: list[str],
    staleness: list[dict[str, Any]],
    seeds: list[int],
    serial: bool = False,
    axes: dict[str, list[Any]] | None = None,
) -> Sweep:
    """Validate the whole grid; return it with one resolved RunConfig per cell."""
    axes = {} if axes is None else axes
    errors: list[tuple[str, str]] = []
    for name, axis in (("presets", presets), ("staleness", staleness), ("seeds", seeds)):
        if not axis:
            errors.append((name, f"choose at least one value for {name}: the grid would be empty"))
    knobs = _check_knobs(base, presets, axes)
    axis_errors = _axis_errors(axes, knobs)
    if axis_errors:  # reported with every other problem; the grid is checked without the axes
        axes = {}
    size = len(presets) * len(staleness) * len(seeds) * math.prod(len(v) for v in axes.values())
    if size > settings.LAB_MAX_SWEEP_RUNS:
        errors.append(
            (
                "presets",
                f"the grid has {size} runs, more than the limit of {settings.LAB_MAX_SWEEP_RUNS}; split it",
            )
        )
    if _too_deep(base):
        errors.append(("config", _depth_error("the config")))
    elif problem := _unstorable(base):
        errors.append(("config", problem))
    if any(_too_deep(setting) for setting in staleness):
        errors.append(("staleness", _depth_error("a staleness setting")))
    if errors:
        raise SweepError(errors + axis_errors)
    # Reported with the grid's own errors, so that one submission shows every problem.
    for name, axis in (("presets", presets), ("seeds", seeds)):
        if repeated := _duplicates(axis):
            shown = ", ".join(str(value) for value in repeated)
            errors.append(
                (name, f"{shown} {'is' if len(repeated) == 1 else 'are'} listed twice; list each once")
            )
    steps = base.get("steps", RunConfig.model_fields["steps"].default)
    cells, cell_errors = _cells(staleness)
    errors += cell_errors
    for each_steps in axes.get("steps", [steps]):  # an axis over steps checks the schedules at each
        errors += [e for e in _staleness_errors(staleness, cells, base, each_steps) if e not in errors]
    errors += _knob_errors(base, knobs)
    knobs_reported = any(name.startswith("algorithm.params.") for name, _ in errors)
    configs, variants = [], []
    context = validation_context()
    for preset, (setting, cell), variant, seed in itertools.product(
        presets, zip(staleness, cells, strict=True), _variants(axes), seeds
    ):
        if cell is None:
            continue
        data = copy.deepcopy(base)
        for dotted, value in variant.items():
            _set_path(data, dotted, value)
        algorithm = data.get("algorithm", {})
        data["algorithm"] = {**algorithm, "preset": preset} if isinstance(algorithm, dict) else algorithm
        data["staleness"] = {k: v for k, v in setting.items() if k not in ("mode", "max_staleness")}
        if cell.mode is not None:
            execution = data.get("execution", {})
            data["execution"] = cell.execution(execution if isinstance(execution, dict) else {})
        data["seed"] = seed
        try:
            configs.append(RunConfig.model_validate(data, context=context))
            variants.append(variant)
        except ValidationError as exc:
            for dotted, message in error_list(exc):
                # What the cell set is reported on the cell's own field.
                from_cell = cell.mode is not None and dotted in ("execution.mode", "execution.max_staleness")
                varied = next((n for n in variant if dotted == n or dotted.startswith(n + ".")), None)
                if varied is not None:
                    error = (f"axes.{varied}", f"{varied} = {variant[varied]!r}: {message}")
                else:
                    error = (_staleness_field(setting) if from_cell else _submitted_name(dotted), message)
                if error not in errors and not (knobs_reported and dotted == "algorithm.params"):
                    errors.append(error)
    errors += axis_errors + _same_cells(configs, variants)
    if errors:
        raise SweepError(errors)
    return Sweep(base, presets, staleness, seeds, configs, serial, axes, variants)


def create_experiment(team: Team, owner, name: str, description: str, sweep: Sweep) -> Experiment:
    """Store the experiment and one queued run per cell; enqueue them after commit.

    Raises `SweepError` (field `team`) when the owner is no longer a member of the team, or the
    team would have more than `LAB_TEAM_MAX_QUEUED` queued runs; both are checked with the team's
    row locked until commit, so two submissions cannot both pass the cap, and a member removed
    meanwhile (the removal takes the same lock) queues nothing."""
    with transaction.atomic():
        _admit(team, owner, sweep)
        experiment = Experiment.objects.create(
            team=team, owner=owner, name=name, description=description, spec=sweep.as_spec()
        )
        _queue(experiment, sweep)
    return experiment


def _admit(team: Team, owner, sweep: Sweep) -> None:
    """Lock the team's row until commit and raise `SweepError` unless `owner` may queue `sweep`'s
    runs in it now: a member, within the queued cap, every precision run by some worker."""
    Team.objects.select_for_update().filter(pk=team.pk).first()
    if not Membership.objects.filter(team=team, user=owner).exists():
        raise SweepError([("team", f"you are not a member of team {team} (any more)")])
    if refusal := queued_cap_refusal(team, len(sweep.configs)):
        raise SweepError([("team", refusal)])
    if problems := Worker.precision_problems(sweep.configs):
        field = "axes.rollout.dtype" if "rollout.dtype" in sweep.axes else "rollout.dtype"
        raise SweepError([(field, message) for _, message in problems])


def _queue(experiment: Experiment, sweep: Sweep) -> list[Run]:
    """One queued run of `experiment` per cell of `sweep`, each sent once the transaction commits.
    A serial sweep's runs are made (so claimed: first in, first out) round robin by seed across its
    cells, every cell's seed 0, then every cell's seed 1, …: a slow drift in outside load falls on
    the cells compared alike, not between them (blocks of one cell's seeds put it between them)."""
    cells = list(zip(sweep.configs, sweep.variants or [{}] * len(sweep.configs), strict=True))
    if sweep.serial:
        cells.sort(key=lambda cell: sweep.seeds.index(cell[0].seed))  # stable: cells in grid order
    runs = []
    for config, variant in cells:
        run = Run.create_for(experiment, config, serial=sweep.serial, variant=variant)
        run.enqueue()
        runs.append(run)
    return runs


MAX_ADDED_SEEDS = 64


def seeds_to_add(experiment: Experiment, n: int) -> list[int]:
    """The next `n` seeds after the experiment's highest; `SweepError` (field `seeds`) when n is not
    1 to `MAX_ADDED_SEEDS`."""
    if not 1 <= n <= MAX_ADDED_SEEDS:
        raise SweepError([("seeds", f"add 1 to {MAX_ADDED_SEEDS} seeds at a time (got {n})")])
    start = max(experiment.spec.get("seeds") or [-1]) + 1
    return list(range(start, start + n))


def add_seeds(experiment: Experiment, owner, n: int) -> list[Run]:
    """Queue every cell of `experiment`'s sweep again with its next `n` seeds, into the same
    experiment (its claims and reports pick them up); its spec lists the new seeds too. Checked as a
    new sweep is (the grid against today's rules, the team's cap, the workers' precisions); raises
    `SweepError` with every problem, queuing nothing then."""
    spec = experiment.spec
    seeds = seeds_to_add(experiment, n)
    sweep = expand(
        spec["config"], spec["presets"], spec["staleness"], seeds, spec.get("serial", False), spec.get("axes")
    )
    with transaction.atomic():
        _admit(experiment.team, owner, sweep)
        locked = Experiment.objects.select_for_update().get(pk=experiment.pk)
        if locked.spec.get("seeds") != spec.get("seeds"):
            raise SweepError([("seeds", "seeds were added to this experiment meanwhile: look again")])
        runs = _queue(experiment, sweep)
        locked.spec = {**locked.spec, "seeds": [*locked.spec["seeds"], *seeds]}
        locked.save(update_fields=["spec"])
    experiment.spec = locked.spec
    return runs


DUPLICATE_WINDOW_S = 600  # a form sent again within this long after one like it is asked about first


def recent_duplicate(team: Team, owner, name: str, sweep: Sweep) -> Experiment | None:
    """The newest experiment `owner` queued in `team` in the last `DUPLICATE_WINDOW_S` seconds with
    this name and this very grid: what the back button and a second submit would queue again."""
    since = timezone.now() - timedelta(seconds=DUPLICATE_WINDOW_S)
    spec = sweep.as_spec()
    recent = Experiment.objects.filter(team=team, owner=owner, name=name, created__gte=since).order_by(
        "-created"
    )
    return next((e for e in recent if e.spec == spec), None)


def submit(owner, sweep: Any) -> Experiment:
    """The API's and the command line's submission: `sweep` has `SweepIn`'s fields (name, team by
    name, description, config, presets, staleness, seeds, serial, axes). Raises `SweepError` with
    every problem (the team, the grid, the queued cap, a precision no worker runs); queues nothing then."""
    team = Team.objects.filter(name=sweep.team, members=owner).first()
    errors = [] if team else [("team", f"{owner.username} is not a member of a team called {sweep.team!r}")]
    try:
        grid = expand(sweep.config, sweep.presets, sweep.staleness, sweep.seeds, sweep.serial, sweep.axes)
    except SweepError as exc:
        errors += exc.errors
    if errors:
        raise SweepError(errors)
    return create_experiment(team, owner, sweep.name, sweep.description, grid)
