"""Runs' metric series in the database: chunks of packed points (`MetricChunk`, packed as
`experiments.packing` says) and one summary per (run, metric) (`MetricSummary`), both written by
`append` in the caller's transaction (the worker's sink, under the run's heartbeat lock), read by
the pages, the API and the comparison through the functions here. A step logged again replaces its
point, so a re-executed step never doubles one.

Values are kept as logged, NaN and ±infinity included; what readers show of a value that is not
finite is a gap (NaN in arrays, null in JSON, empty in CSV)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

import numpy as np
from django.db import connection
from django.db.models import F, FloatField, OuterRef, Subquery
from django.db.models.functions import Cast, NullIf

from experiments import packing
from experiments.models import MetricChunk, MetricSummary

# (steps, values, wall times in µs since the epoch) of one metric, sorted by step.
Arrays = tuple[np.ndarray, np.ndarray, np.ndarray]
# Per run: (steps as floats, values with NaN for what is not finite, wall times in s or None).
Points = dict[int, tuple[np.ndarray, np.ndarray, np.ndarray | None]]


def _upsert(model, key: tuple[str, ...], columns: tuple[str, ...], rows: list[tuple]) -> None:
    """INSERT … ON CONFLICT (key) DO UPDATE: one parameterised statement over all rows (PostgreSQL
    and SQLite alike), without a model instance per row."""
    if not rows:
        return
    quote = connection.ops.quote_name
    names = (*key, *columns)
    sql = (
        f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(map(quote, names))}) "
        f"VALUES ({', '.join(['%s'] * len(names))}) ON CONFLICT ({', '.join(map(quote, key))}) "
        f"DO UPDATE SET {', '.join(f'{quote(c)} = excluded.{quote(c)}' for c in columns)}"
    )
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)


def _decode(chunk: int, step_data, value_data, time_data=None) -> tuple[np.ndarray, ...]:
    steps = packing.unpack_steps(chunk, step_data)
    values = packing.unpack_values(value_data)
    if time_data is None:
        return steps, values
    return steps, values, packing.unpack_times(time_data)


def _by_name(points: Iterable[tuple[str, int, float | None, datetime]]) -> dict[str, Arrays]:
    columns: dict[str, tuple[list, list, list]] = defaultdict(lambda: ([], [], []))
    for name, step, value, wall in points:
        steps, values, times = columns[name]
        steps.append(packing.check_step(int(step)))
        values.append(float("nan") if value is None else float(value))
        times.append(packing.micros(wall))
    return {name: packing.sorted_points(*arrays) for name, arrays in columns.items()}


def append(run_id: int, points: Iterable[tuple[str, int, float | None, datetime]]) -> None:
    """Store (name, step, value, wall time) points of run `run_id`: each merged into its chunk (a
    step already there takes the new value and time), and each metric's summary brought up to
    date (extended when every new step comes after its last one, else summed up again). Run it
    in a transaction: chunks are read, merged and written back."""
    new = _by_name(points)
    if not new:
        return
    wanted = {
        (name, int(c)) for name, (steps, _, _) in new.items() for c in np.unique(steps >> packing.CHUNK_BITS)
    }
    stored = {
        (name, chunk): _decode(chunk, *data)
        for name, chunk, *data in MetricChunk.objects.filter(
            run_id=run_id, name__in=list(new), chunk__in=sorted({c for _, c in wanted})
        ).values_list("name", "chunk", "step_data", "value_data", "time_data")
        if (name, chunk) in wanted
    }
    rows = []
    for name, (steps, values, times) in new.items():
        keys = steps >> packing.CHUNK_BITS
        bounds = np.flatnonzero(np.diff(keys)) + 1
        for part in np.split(np.arange(len(steps)), bounds):
            chunk = int(keys[part[0]])
            merged = packing.merge(stored.get((name, chunk)), (steps[part], values[part], times[part]))
            rows.append(
                (
                    run_id,
                    name,
                    chunk,
                    len(merged[0]),
                    packing.pack_steps(chunk, merged[0]),
                    packing.pack_values(merged[1]),
                    packing.pack_times(merged[2]),
                )
            )
    _upsert(MetricChunk, ("run_id", "name", "chunk"), ("count", "step_data", "value_data", "time_data"), rows)

    summaries = {
        row["name"]: row
        for row in MetricSummary.objects.filter(run_id=run_id, name__in=list(new)).values(
            "name", *packing.SUMMARY_FIELDS
        )
    }
    updated = []
    for name, (steps, values, _) in new.items():
        before = summaries.get(name)
        if before is not None and steps[0] > before["last_step"]:
            summary = packing.extend(before, steps, values)
        else:  # a step logged again, or one before the last: sum the whole series up again
            whole = series(run_id, name)
            summary = packing.summarise(whole[0], whole[1])
        updated.append(summary | {"name": name})
    adapt = connection.ops.adapt_json_value
    fields = packing.SUMMARY_FIELDS
    _upsert(
        MetricSummary,
        ("run_id", "name"),
        fields,
        [(run_id, s["name"], *(adapt(s[f], None) if f == "tail" else s[f] for f in fields)) for s in updated],
    )


def series(run_id: int, name: str) -> Arrays:
    """(steps, values, wall times in µs) of one metric of one run, sorted by step."""
    rows = MetricChunk.objects.filter(run_id=run_id, name=name).order_by("chunk")
    parts = [
        _decode(c, *data) for c, *data in rows.values_list("chunk", "step_data", "value_data", "time_data")
    ]
    if not parts:
        return np.empty(0, np.int64), np.empty(0), np.empty(0, np.int64)
    return tuple(np.concatenate(columns) for columns in zip(*parts, strict=True))


def by_run(run_ids: list[int], name: str, with_time: bool = False) -> Points:
    """(steps, values, wall times in s or None) of metric `name` per run, sorted by step, from one
    query over the runs' chunks; a value that is not finite (NaN, ±infinity) is NaN."""
    if not run_ids:
        return {}
    fields = ["run_id", "chunk", "step_data", "value_data"] + (["time_data"] if with_time else [])
    rows = (
        MetricChunk.objects.filter(run_id__in=run_ids, name=name)
        .order_by("run_id", "chunk")
        .values_list(*fields)
    )
    parts: dict[int, list[tuple[np.ndarray, ...]]] = defaultdict(list)
    for run_id, chunk, *data in rows:
        parts[run_id].append(_decode(chunk, *data))
    out: Points = {}
    for run_id, decoded in parts.items():
        columns = [np.concatenate(c) for c in zip(*decoded, strict=True)]
        values = columns[1]
        values[~np.isfinite(values)] = np.nan
        times = columns[2] / 1e6 if with_time else None
        out[run_id] = (columns[0].astype(np.float64), values, times)
    return out


def points_of(run_id: int, name: str = "") -> Iterable[tuple[str, Arrays]]:
    """Every metric of the run (or metric `name` only) in name order: (name, its arrays)."""
    rows = MetricChunk.objects.filter(run_id=run_id).order_by("name", "chunk")
    if name:
        rows = rows.filter(name=name)
    current, parts = None, []
    for metric, chunk, *data in rows.values_list(
        "name", "chunk", "step_data", "value_data", "time_data"
    ).iterator():
        if metric != current and parts:
            yield current, tuple(np.concatenate(c) for c in zip(*parts, strict=True))
            parts = []
        current = metric
        parts.append(_decode(chunk, *data))
    if parts:
        yield current, tuple(np.concatenate(c) for c in zip(*parts, strict=True))


def shown(value: float) -> float | None:
    """A stored value as pages and the API show it: None when not finite."""
    value = float(value)
    return value if np.isfinite(value) else None


def recent(run_id: int, n: int) -> tuple[list[int], dict[str, dict[int, float | None]]]:
    """The run's `n` latest steps (of any metric), ascending, and {metric: {step: value}} at them,
    read from the newest chunks back only as far as those steps reach."""
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
        rows = MetricChunk.objects.filter(run_id=run_id, chunk=chunk)
        for name, *data in rows.values_list("name", "step_data", "value_data"):
            for step, value in zip(*(a.tolist() for a in _decode(chunk, *data)), strict=True):
                found[name][step] = value
                steps.add(step)
    latest = sorted(steps)[-n:] if n else []
    keep = set(latest)
    table = {
        name: {s: shown(v) for s, v in values.items() if s in keep} for name, values in sorted(found.items())
    }
    return latest, {name: values for name, values in table.items() if values}


def summary(field: str, name: str) -> Subquery:
    """The outer run's summary `field` of metric `name` (`MetricSummary`; "mean": of its finite
    values), for annotating a queryset of runs; None where the run logged no such metric."""
    rows = MetricSummary.objects.filter(run=OuterRef("pk"), name=name)
    if field == "mean":
        mean = Cast(F("total"), FloatField()) / NullIf(F("finite"), 0)
        return Subquery(rows.annotate(mean=mean).values("mean")[:1], output_field=FloatField())
    return Subquery(rows.values(field)[:1])


def points_count(runs) -> int:
    """How many points the runs (a queryset) logged, from their summaries."""
    counts = MetricSummary.objects.filter(run__in=runs).values_list("count", flat=True)
    return sum(counts)
