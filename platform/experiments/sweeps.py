"""A sweep: one base run config crossed with presets × staleness cells × seeds × any other config
fields' value lists (`axes`, e.g. `{"optimizer.minibatches": [1, 4]}`: each combination is a cell,
its values the run's `variant`). A staleness cell is a schedule run simulated or distributed, or
an async cell with its bound (`StalenessCell`), so execution is an axis of the grid beside staleness.
`expand` validates every cell through `RunConfig` and names each problem once by the field the
submitter wrote (`presets`, `staleness.sync_offset`, `staleness.async`, `rollout.group_size`; the
checks of its own are `sweep_checks`); `create_experiment` refuses a sweep over
`LAB_TEAM_MAX_QUEUED` and sends the runs' messages after the transaction commits."""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from pydantic import ValidationError

from accounts.mirroring import spec_errors as mirror_spec_errors
from accounts.models import Membership, Team
from execution.models import Worker
from experiments import sweep_checks as checks
from experiments.models import Experiment, Run, validation_context
from rlcore.config import RunConfig, error_list

# Where a grid axis lands in RunConfig, and the name the submitter used for it.
_AXIS_FIELDS = {"algorithm.preset": "presets", "seed": "seeds"}


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
    # Where its runs are mirrored, over their team's setting (`imports.mirror`): {"mlflow_uri",
    # "tensorboard"}, each optional.
    mirror: dict[str, Any] = field(default_factory=dict)

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
            **({"mirror": self.mirror} if self.mirror else {}),
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


def _variants(axes: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the axes' values, in order (the last axis varies fastest)."""
    names = list(axes)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(axes[n] for n in names))]


def _submitted_name(dotted: str) -> str:
    for prefix, name in _AXIS_FIELDS.items():
        if dotted == prefix or dotted.startswith(prefix + "."):
            return name
    return dotted


def expand(
    base: dict[str, Any],
    presets: list[str],
    staleness: list[dict[str, Any]],
    seeds: list[int],
    serial: bool = False,
    axes: dict[str, list[Any]] | None = None,
    mirror: dict[str, Any] | None = None,
) -> Sweep:
    """Validate the whole grid; return it with one resolved RunConfig per cell."""
    axes = {} if axes is None else axes
    mirror = {} if mirror is None else mirror
    errors: list[tuple[str, str]] = mirror_spec_errors(mirror)
    for name, axis in (("presets", presets), ("staleness", staleness), ("seeds", seeds)):
        if not axis:
            errors.append((name, f"choose at least one value for {name}: the grid would be empty"))
    knobs = checks.check_knobs(base, presets, axes)
    axis_errors = checks.axis_errors(axes, knobs)
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
    if checks.too_deep(base):
        errors.append(("config", checks.depth_error("the config")))
    elif problem := checks.unstorable(base):
        errors.append(("config", problem))
    if any(checks.too_deep(setting) for setting in staleness):
        errors.append(("staleness", checks.depth_error("a staleness setting")))
    if errors:
        raise SweepError(errors + axis_errors)
    # Reported with the grid's own errors, so that one submission shows every problem.
    for name, axis in (("presets", presets), ("seeds", seeds)):
        if repeated := checks.duplicates(axis):
            shown = ", ".join(str(value) for value in repeated)
            errors.append(
                (name, f"{shown} {'is' if len(repeated) == 1 else 'are'} listed twice; list each once")
            )
    steps = base.get("steps", RunConfig.model_fields["steps"].default)
    cells, cell_errors = checks.cells(staleness)
    errors += cell_errors
    for each_steps in axes.get("steps", [steps]):  # an axis over steps checks the schedules at each
        errors += [e for e in checks.staleness_errors(staleness, cells, base, each_steps) if e not in errors]
    errors += checks.knob_errors(base, knobs)
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
                    error = (
                        checks.staleness_field(setting) if from_cell else _submitted_name(dotted),
                        message,
                    )
                if error not in errors and not (knobs_reported and dotted == "algorithm.params"):
                    errors.append(error)
    errors += axis_errors + checks.same_cells(configs, variants)
    errors += [e for e in checks.train_process_errors(configs, variants) if e not in errors]
    if errors:
        raise SweepError(errors)
    return Sweep(base, presets, staleness, seeds, configs, serial, axes, variants, mirror)


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
    runs in it now: a member, within the queued cap, every precision run by some worker, and no
    more trainer processes than some worker of the queue has cores or GPUs for."""
    Team.objects.select_for_update().filter(pk=team.pk).first()
    if not Membership.objects.filter(team=team, user=owner).exists():
        raise SweepError([("team", f"you are not a member of team {team} (any more)")])
    if refusal := Run.queued_cap_refusal(team, len(sweep.configs)):
        raise SweepError([("team", refusal)])
    if problems := Worker.precision_problems(sweep.configs):
        field = "axes.rollout.dtype" if "rollout.dtype" in sweep.axes else "rollout.dtype"
        raise SweepError([(field, message) for _, message in problems])
    if problems := Worker.train_process_problems(sweep.configs):
        field = (
            f"axes.{checks.TRAIN_PROCESSES}"
            if checks.TRAIN_PROCESSES in sweep.axes
            else checks.TRAIN_PROCESSES
        )
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
        spec["config"],
        spec["presets"],
        spec["staleness"],
        seeds,
        spec.get("serial", False),
        spec.get("axes"),
        spec.get("mirror"),
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
    name, description, config, presets, staleness, seeds, serial, axes, mirror). Raises `SweepError` with
    every problem (the team, the grid, the queued cap, a precision no worker runs); queues nothing then."""
    team = Team.objects.filter(name=sweep.team, members=owner).first()
    errors = [] if team else [("team", f"{owner.username} is not a member of a team called {sweep.team!r}")]
    try:
        grid = expand(
            sweep.config, sweep.presets, sweep.staleness, sweep.seeds, sweep.serial, sweep.axes, sweep.mirror
        )
    except SweepError as exc:
        errors += exc.errors
    if errors:
        raise SweepError(errors)
    return create_experiment(team, owner, sweep.name, sweep.description, grid)
