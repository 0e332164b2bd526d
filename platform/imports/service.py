"""Importing one run from another tool's file into an experiment: the file read by its tool's reader
(`imports.formats`), its metric names mapped to the lab's (the tool's default mapping with the
user's changes; names left unmapped go under `imported/…`), the run placed in the experiment's grid
at the preset, staleness cell and seed the user gives (or the file's config does), and stored in
one transaction as a succeeded `Run` whose points go through `experiments.series.Writer`, the way a
native run's do, with its provenance in an `Import` beside it. Re-importing a file the experiment
already holds (the same sha256) changes nothing and returns the first import.

Every refusal is an `ImportRefused` naming the field (`file`, `tool`, `preset`, `staleness`,
`seed`, `mapping`, `experiment`) and the rule; nothing is stored then."""

from __future__ import annotations

import copy
import hashlib
import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from pydantic import ValidationError

from experiments import series
from experiments.models import Experiment, Run, validation_context
from imports import formats
from imports.formats.base import ImportFormatError, ParsedRun, Point
from imports.models import Import
from lab.errors import FieldError
from rlcore.config import MAX_STEPS, RunConfig, StalenessCell, cell_label, error_list

METRIC_NAME_MAX = 100  # MetricChunk.name
STALENESS_SYNTAX = (
    "on-policy, offline, sync_interval=k, sync_offset=d, sync_interval=k,sync_offset=d (any of these "
    "followed by ' (distributed)'), or async ≤ k"
)


class ImportRefused(FieldError):
    """What keeps a file from being imported: the field and the rule, naming the file (and the
    line or record) where the file is the trouble."""


@dataclass(frozen=True)
class Placement:
    """Where the run goes in the experiment's grid; None: from the file's config."""

    preset: str | None = None
    staleness: str | None = None
    seed: int | None = None


@dataclass
class Outcome:
    """An import: the `Import` row (its run is `record.run`), and whether this call made it
    (False: the experiment held this file already, and nothing changed)."""

    record: Import
    created: bool
    notes: list[str] = field(default_factory=list)


def size_of(path: Path) -> int:
    """Bytes of a file, or of every file under a folder."""
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def sha256_of(path: Path) -> str:
    """The sha256 of a file's bytes; of a folder, of each file's relative path and bytes in path order."""
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        if path.is_dir():
            digest.update(file.relative_to(path).as_posix().encode() + b"\0")
        with file.open("rb") as stream:
            while chunk := stream.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def check_size(name: str, size: int) -> None:
    cap = settings.LAB_IMPORT_MAX_BYTES
    if size > cap:
        raise ImportRefused(
            "file", f"{name} is {size:,} bytes, more than the {cap:,} an import may be (LAB_IMPORT_MAX_BYTES)"
        )


def parse_mapping(pairs: list[str]) -> dict[str, str]:
    """`["source=lab", …]` (the command line's and the form's lines) as {source: lab}; an
    `ImportRefused` (field `mapping`) names a pair that is not one."""
    mapping: dict[str, str] = {}
    for number, pair in enumerate(pairs, start=1):
        source, sep, target = pair.partition("=")
        if not sep or not source.strip() or not target.strip():
            raise ImportRefused(
                "mapping",
                f"entry {number} ({pair[:80]!r}) must be source_name=lab_name, e.g. train/reward=reward/mean",
            )
        mapping[source.strip()] = target.strip()
    return mapping


def mapping_for(tool: str, changes: dict[str, str]) -> dict[str, str]:
    """The tool's default mapping with the user's `changes`, each target a name the lab can store."""
    for source, target in changes.items():
        if not target or len(target) > METRIC_NAME_MAX or "\x00" in target:
            raise ImportRefused(
                "mapping",
                f"{source} → {target[:80]!r}: a lab metric name is 1 to {METRIC_NAME_MAX} characters, no NUL",
            )
    return {**formats.DEFAULT_MAPPINGS.get(tool, {}), **changes}


def cell_labels(experiment: Experiment) -> dict[str, dict[str, Any]]:
    """{label: cell} of the experiment's staleness cells, as its runs are labelled."""
    execution = experiment.spec.get("config", {}).get("execution", {})
    execution = execution if isinstance(execution, dict) else {}
    labels = {}
    for setting in experiment.spec.get("staleness", []):
        try:
            labels[_label(StalenessCell.model_validate(setting), execution)] = setting
        except ValidationError:
            continue  # a cell today's rules refuse: not one to import into
    return labels


def _label(cell: StalenessCell, base_execution: dict[str, Any]) -> str:
    execution = cell.execution(base_execution)
    return cell_label(execution.get("mode", "simulated"), cell.schedule.label, execution.get("max_staleness"))


ASYNC = re.compile(r"^async\s*(?:≤|<=)\s*(\d{1,9})$")


def staleness_cell(experiment: Experiment, text: str) -> dict[str, Any]:
    """The staleness cell `text` names: a label of one of the experiment's cells, or a cell written
    as its label reads (`STALENESS_SYNTAX`)."""
    text = " ".join(text.split())
    known = cell_labels(experiment)
    if text in known:
        return known[text]
    setting: dict[str, Any] = {}
    rest = text
    if rest.endswith("(distributed)"):
        setting["mode"], rest = "distributed", rest.removesuffix("(distributed)").strip()
    if found := ASYNC.match(rest):
        setting = {"mode": "async", "max_staleness": int(found[1])}
    elif rest == "offline":
        setting["offline"] = True
    elif rest != "on-policy":
        for part in rest.split(","):
            key, sep, value = part.strip().partition("=")
            if key not in ("sync_interval", "sync_offset") or not sep or not value.strip().isdigit():
                cells = ", ".join(known) or "none"
                raise ImportRefused(
                    "staleness",
                    f"{text[:80]!r} is not a staleness cell: write {STALENESS_SYNTAX} (this experiment's: {cells})",
                )
            setting[key] = int(value)
    try:
        StalenessCell.model_validate(setting)
    except ValidationError as exc:
        raise ImportRefused("staleness", "; ".join(f"{f}: {m}" for f, m in error_list(exc))) from exc
    return setting


def _field_of(dotted: str) -> str:
    """The import's field a RunConfig error is about."""
    if dotted.startswith("algorithm"):
        return "preset"
    if dotted.startswith(("staleness", "execution")):
        return "staleness"
    return {"seed": "seed", "steps": "file"}.get(dotted, "experiment")


def run_config(experiment: Experiment, preset: str, cell: dict[str, Any], seed: int, steps: int) -> RunConfig:
    """The imported run's config: the experiment's base config at the preset, staleness cell and
    seed given, with the file's steps, validated as a sweep's cells are."""
    data = copy.deepcopy(experiment.spec.get("config", {}))
    algorithm = data.get("algorithm", {})
    data["algorithm"] = {**(algorithm if isinstance(algorithm, dict) else {}), "preset": preset}
    data["staleness"] = {k: v for k, v in cell.items() if k not in ("mode", "max_staleness")}
    parsed = StalenessCell.model_validate(cell)
    if parsed.mode is not None:
        execution = data.get("execution", {})
        data["execution"] = parsed.execution(execution if isinstance(execution, dict) else {})
    data["seed"], data["steps"] = seed, steps
    try:
        return RunConfig.model_validate(data, context=validation_context())
    except ValidationError as exc:
        dotted, message = error_list(exc)[0]
        where = _field_of(dotted)
        if where == "experiment":
            message = f"this experiment's config no longer passes today's checks ({dotted}: {message})"
        elif where == "file":
            message = f"the file's last step ({steps}) as the run's steps: {message}"
        raise ImportRefused(where, message) from exc


def _from_config(config: dict[str, Any], key: str, kind: type) -> Any:
    """`config[key]` as a `kind`; a whole number may be text (MLflow keeps every param as text)."""
    value = config.get(key)
    if kind is int and isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


def placement_of(parsed: ParsedRun, given: Placement) -> tuple[str, str, int]:
    """Preset, staleness and seed: as given, else as the file's config says (its `preset`,
    `staleness` and `seed`); an `ImportRefused` names the one neither gives."""
    preset = given.preset or _from_config(parsed.config, "preset", str)
    staleness = given.staleness or _from_config(parsed.config, "staleness", str)
    seed = given.seed if given.seed is not None else _from_config(parsed.config, "seed", int)
    for name, value in (("preset", preset), ("staleness", staleness), ("seed", seed)):
        if value is None:
            raise ImportRefused(name, f"give the {name}: the file's config does not say it")
    return preset, staleness, seed


def storable(value: Any) -> Any:
    """`value` as PostgreSQL's text and JSON keep it: NUL and lone surrogates replaced, NaN and ±inf
    (which JSON has no word for) as the text "nan", "inf", "-inf"."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {storable(str(k)): storable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [storable(v) for v in value]
    return value


def _wall(time: float | None, fallback: datetime, point: Point) -> datetime:
    if time is None:
        return fallback
    try:
        if not math.isfinite(time):
            raise ValueError
        return datetime.fromtimestamp(time, UTC)
    except (ValueError, OverflowError, OSError) as exc:
        raise ImportRefused(
            "file", f"{point.name} at step {point.step}: its time {time!r} is no Unix time in seconds"
        ) from exc


def import_file(
    experiment: Experiment,
    user,
    tool: str,
    path: Path,
    placement: Placement = Placement(),
    mapping: dict[str, str] | None = None,
    name: str | None = None,
    run: str | None = None,
) -> Outcome:
    """Import the run in `path` (a file, or an exported folder), read as `tool` writes it, into
    `experiment`; `name` is the file's name as the user knows it (an upload's), default the path's;
    `run` names the run to read in a file that holds several (a Trackio project). An
    `ImportRefused` says why not, and then nothing is stored."""
    name, run_name = name or path.name, run or ""
    if len(run_name) > 200:
        raise ImportRefused("run", f"a run's name is at most 200 characters (got {len(run_name)})")
    if tool not in formats.TOOLS:
        raise ImportRefused("tool", f"tool must be one of {', '.join(formats.TOOLS)} (got {tool!r})")
    if not path.exists():
        raise ImportRefused("file", f"{name} does not exist")
    size = size_of(path)
    check_size(name, size)
    sha256 = sha256_of(path)
    if (
        existing := Import.objects.filter(experiment=experiment, sha256=sha256, run_name=run_name).first()
    ) is not None:
        return Outcome(
            existing, False, [f"{name} was imported already, as run {existing.run_id}: nothing changed"]
        )
    applied_mapping = mapping_for(tool, mapping or {})
    try:
        parsed = formats.read(tool, path, max_bytes=settings.LAB_IMPORT_MAX_BYTES, run=run_name or None)
    except ImportFormatError as exc:
        where = f"{name}, {exc.where}" if exc.where else name
        raise ImportRefused("file", f"{where}: {exc.rule}") from exc
    except (ValueError, OverflowError, OSError) as exc:  # what a reader let through: still the file's fault
        raise ImportRefused("file", f"{name}: cannot be read as {tool} writes it ({exc})") from exc
    if not parsed.points:
        raise ImportRefused("file", f"{name}: no metric points in it")
    preset, staleness, seed = placement_of(parsed, placement)
    mapped, renamed = _mapped(parsed.points, applied_mapping)
    steps = [p.step for p in parsed.points]
    last_step = max(steps)
    if last_step > MAX_STEPS:
        raise ImportRefused(
            "file", f"{name}: its last step is {last_step:,}; a lab run has at most {MAX_STEPS:,} steps"
        )
    config = run_config(experiment, preset, staleness_cell(experiment, staleness), seed, max(1, last_step))
    now = timezone.now()
    points = [(p.name, p.step, p.value, _wall(p.time, now, p)) for p in mapped]
    logged = [wall for point, (*_, wall) in zip(mapped, points, strict=True) if point.time is not None]
    first_time, last_time = (min(logged), max(logged)) if logged else (None, None)
    try:
        with transaction.atomic():
            made = Run.create_for(
                experiment,
                config,
                status=Run.SUCCEEDED,
                progress=last_step,
                started=first_time or now,
                finished=last_time or now,
            )
            record = Import.objects.create(
                run=made,
                experiment=experiment,
                tool=tool,
                tool_version=storable(parsed.tool_version or "")[:100],
                original_run_id=storable(parsed.original_run_id or "")[:200],
                file_name=storable(name)[:255],
                file_size=size,
                sha256=sha256,
                run_name=run_name,
                original_config=storable(parsed.config),
                mapping=renamed,
                points=len(points),
                first_time=first_time,
                last_time=last_time,
                imported_by=user,
            )
            series.Writer(made.pk).write(points)
            series.seal(made.pk)
            made.summary = made.summary_from_points()
            made.save(update_fields=["summary"])
    except IntegrityError:
        # The same file, imported into this experiment by a request that committed meanwhile.
        existing = Import.objects.filter(experiment=experiment, sha256=sha256, run_name=run_name).first()
        if existing is None:
            raise
        return Outcome(
            existing, False, [f"{name} was imported already, as run {existing.run_id}: nothing changed"]
        )
    return Outcome(record, True)


def _mapped(points: list[Point], mapping: dict[str, str]) -> tuple[list[Point], dict[str, str]]:
    """The points under the lab's names (`formats.map_points`) and {source name: lab name} of each
    name the file logs; an `ImportRefused` (field `mapping`) when two names land on one at a step,
    or a name is too long to store."""
    try:
        mapped = formats.map_points(points, mapping)
    except ValueError as exc:
        raise ImportRefused("mapping", str(exc)) from exc
    renamed = {}
    for source, point in zip(points, mapped, strict=True):
        renamed.setdefault(source.name, point.name)
    for source, target in renamed.items():
        if storable(target) != target:
            raise ImportRefused("file", f"the metric name {source!r} holds characters the lab cannot store")
        if len(target) > METRIC_NAME_MAX:
            raise ImportRefused(
                "mapping",
                f"{source} would be stored as {target[:60]}…, longer than {METRIC_NAME_MAX} characters: "
                "map it to a shorter name",
            )
    return mapped, renamed
