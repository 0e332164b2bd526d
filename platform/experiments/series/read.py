"""Reading runs' metric series: a run's metric as arrays, many runs' at once, every metric of a
run, the newest steps for a table, a summary field as a subquery; a chunk whose bytes do not
decode is left out and named (`Damage`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from django.db.models import F, FloatField, OuterRef, Subquery
from django.db.models.functions import Cast, NullIf

from experiments import packing
from experiments.models import MetricChunk, MetricSummary

# (steps, values, wall times in µs since the epoch) of one metric, sorted by step.
Arrays = tuple[np.ndarray, np.ndarray, np.ndarray]
# (steps, values, wall times in µs) of one metric as a flush brings them, in the order logged.
Columns = tuple[list[int], list[float], list[int]]
# Per run: (steps as floats, values with NaN for what is not finite, wall times in s or None).
Points = dict[int, tuple[np.ndarray, np.ndarray, np.ndarray | None]]


CHUNK_FIELDS = ("chunk", "packed", "step_data", "value_data")  # then "time_data" where times are read


def decode(chunk: int, packed: bool, step_data, value_data, time_data=None) -> tuple[np.ndarray, ...]:
    return packing.decode(
        chunk, packed, bytes(step_data), bytes(value_data), None if time_data is None else bytes(time_data)
    )


@dataclass(frozen=True)
class Damage:
    """A stored chunk of one run's metric whose bytes do not decode (`packing.Damaged`): its points
    are unknown. The readers that take a list of these leave the chunk out (a gap in the metric)
    and add it to the list, for the page or the answer to say so (`note`)."""

    run_id: int
    name: str
    chunk: int
    reason: str

    def note(self) -> str:
        first = self.chunk << packing.CHUNK_BITS
        return (
            f"{self.name}: the points stored for steps {first}–{first + packing.CHUNK_STEPS - 1} are damaged "
            f"and cannot be read ({self.reason}); they are left out, a gap, not values"
        )


def notes_by_metric(damaged: list[Damage]) -> dict[str, list[str]]:
    """{metric: its damaged chunks' notes}, as the run's curves and the API give them."""
    notes: dict[str, list[str]] = defaultdict(list)
    for d in damaged:
        notes[d.name].append(d.note())
    return dict(notes)


READ_FIELDS = ("count", *CHUNK_FIELDS)  # a reader's columns: `count` lets `packing.decode` check the length


def _read(run_id: int, name: str, data: tuple, damaged: list[Damage] | None) -> tuple[np.ndarray, ...] | None:
    """A chunk's arrays from its `READ_FIELDS` (and "time_data"), or None when its bytes are
    damaged and `damaged` collects it (once per chunk); without `damaged`, `packing.Damaged` is raised."""
    count, chunk, packed, step_data, value_data, *times = data
    try:
        return packing.decode(
            chunk, packed, bytes(step_data), bytes(value_data), *(bytes(t) for t in times), count=count
        )
    except packing.Damaged as exc:
        if damaged is None:
            raise
        if not any((d.run_id, d.name, d.chunk) == (run_id, name, chunk) for d in damaged):
            damaged.append(Damage(run_id, name, chunk, str(exc)))
        return None


def _joined(parts: list[tuple[np.ndarray, ...]]) -> Arrays:
    """Decoded parts (with times) as one metric's arrays, empty when every part was damaged."""
    if parts:
        return tuple(np.concatenate(c) for c in zip(*parts, strict=True))
    return np.empty(0, np.int64), np.empty(0), np.empty(0, np.int64)


def stored_summaries(run_id: int, names) -> dict[str, dict]:
    """{name: summary as `packing.summarise` gives it} of the run's metrics among `names`."""
    rows = MetricSummary.objects.filter(run_id=run_id, name__in=list(names)).values(
        "name", *packing.SUMMARY_FIELDS
    )
    return {row.pop("name"): row | {"tail": packing.unpack_tail(row["tail"])} for row in rows}


def series(run_id: int, name: str) -> Arrays:
    """(steps, values, wall times in µs) of one metric of one run, sorted by step."""
    return MetricChunk.series(run_id, name)


def by_run(
    run_ids: list[int], name: str, with_time: bool = False, damaged: list[Damage] | None = None
) -> Points:
    """(steps, values, wall times in s or None) of metric `name` per run, sorted by step, from one
    query over the runs' chunks; a value that is not finite (NaN, ±infinity) is NaN. A damaged
    chunk is left out and added to `damaged` (without it, `packing.Damaged` is raised)."""
    if not run_ids:
        return {}
    fields = ["run_id", *READ_FIELDS] + (["time_data"] if with_time else [])
    rows = (
        MetricChunk.objects.filter(run_id__in=run_ids, name=name)
        .order_by("run_id", "chunk", "part")
        .values_list(*fields)
    )
    parts: dict[int, list[tuple[np.ndarray, ...]]] = defaultdict(list)
    for run_id, *data in rows:
        decoded = _read(run_id, name, data, damaged)
        if decoded is not None:
            parts[run_id].append(decoded)
    out: Points = {}
    for run_id, decoded in parts.items():
        columns = [np.concatenate(c) for c in zip(*decoded, strict=True)]
        values = columns[1]
        values[~np.isfinite(values)] = np.nan
        times = columns[2] / 1e6 if with_time else None
        out[run_id] = (columns[0].astype(np.float64), values, times)
    return out


def points_of(
    run_id: int, name: str = "", damaged: list[Damage] | None = None
) -> Iterable[tuple[str, Arrays]]:
    """Every metric of the run (or metric `name` only) in name order: (name, its arrays). A damaged
    chunk is left out and added to `damaged` by the time its metric is yielded (a metric with no
    chunk left has no points); without `damaged`, `packing.Damaged` is raised."""
    rows = MetricChunk.objects.filter(run_id=run_id).order_by("name", "chunk", "part")
    if name:
        rows = rows.filter(name=name)
    current, parts = None, []
    for metric, *data in rows.values_list("name", *READ_FIELDS, "time_data").iterator():
        if metric != current and current is not None:
            yield current, _joined(parts)
            parts = []
        current = metric
        decoded = _read(run_id, metric, data, damaged)
        if decoded is not None:
            parts.append(decoded)
    if current is not None:
        yield current, _joined(parts)


shown = packing.finite_or_none  # a stored value as pages and the API show it: None when not finite


def recent(
    run_id: int, n: int, damaged: list[Damage] | None = None
) -> tuple[list[int], dict[str, dict[int, float | None]]]:
    """The run's `n` latest steps (of any metric), ascending, and {metric: {step: value}} at them,
    the values as logged (a NaN or ±inf included, for the page to tell it from a step with none),
    read from the newest chunks back only as far as those steps reach. A damaged chunk is left out
    and added to `damaged` (without it, `packing.Damaged` is raised)."""
    chunks = list(
        MetricChunk.objects.filter(run_id=run_id)
        .order_by("-chunk")
        .values_list("chunk", flat=True)
        .distinct()
    )
    found: dict[str, dict[int, float | None]] = defaultdict(dict)
    steps: set[int] = set()
    for chunk in chunks:
        if len(steps) >= n and sorted(steps)[-n] >= (chunk + 1) << packing.CHUNK_BITS:
            break  # every step of this chunk and older ones is older than the n found
        rows = MetricChunk.objects.filter(run_id=run_id, chunk=chunk).order_by("name", "part")
        for name, *data in rows.values_list("name", *READ_FIELDS):
            decoded = _read(run_id, name, data, damaged)
            for step, value in zip(*(a.tolist() for a in decoded or ()), strict=True):
                found[name][step] = value
                steps.add(step)
    latest = sorted(steps)[-n:] if n else []
    keep = set(latest)
    table = {name: {s: v for s, v in values.items() if s in keep} for name, values in sorted(found.items())}
    return latest, {name: values for name, values in table.items() if values}


def summary(field: str, name: str) -> Subquery:
    """The outer run's summary `field` of metric `name` (`MetricSummary`; "mean": of its finite
    values), for annotating a queryset of runs; None where the run logged no such metric."""
    rows = MetricSummary.objects.filter(run=OuterRef("pk"), name=name)
    if field == "mean":
        mean = Cast(F("total"), FloatField()) / NullIf(F("finite"), 0)
        return Subquery(rows.annotate(mean=mean).values("mean")[:1], output_field=FloatField())
    return Subquery(rows.values(field)[:1])
