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


CHUNK_FIELDS = ("chunk", "packed", "step_data", "value_data")  # then "time_data" where times are read


def _decode(chunk: int, packed: bool, step_data, value_data, time_data=None) -> tuple[np.ndarray, ...]:
    return packing.decode(
        chunk, packed, bytes(step_data), bytes(value_data), None if time_data is None else bytes(time_data)
    )


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
    date (extended when every new step comes after its last one, else summed up again). A series'
    newest chunk stays raw while it grows and is packed once the series moves past it (or `seal`).
    Run it in a transaction: chunks are read, merged and written back."""
    new = _by_name(points)
    if not new:
        return
    summaries = {
        row["name"]: row
        for row in MetricSummary.objects.filter(run_id=run_id, name__in=list(new)).values(
            "name", *packing.SUMMARY_FIELDS
        )
    }
    newest, wanted = {}, set()
    for name, (steps, _, _) in new.items():
        before = summaries.get(name)
        newest[name] = packing.chunk_of(
            max(int(steps[-1]), before["last_step"] if before else int(steps[-1]))
        )
        wanted |= {(name, int(c)) for c in np.unique(steps >> packing.CHUNK_BITS)}
        if before is not None and packing.chunk_of(before["last_step"]) < newest[name]:
            wanted.add((name, packing.chunk_of(before["last_step"])))  # the raw chunk it moves past
    stored = {
        (name, chunk): _decode(chunk, *data)
        for name, chunk, *data in MetricChunk.objects.filter(
            run_id=run_id, name__in=list(new), chunk__in=sorted({c for _, c in wanted})
        ).values_list("name", *CHUNK_FIELDS, "time_data")
        if (name, chunk) in wanted
    }
    parts: dict[tuple[str, int], tuple[np.ndarray, ...]] = {}
    for name, (steps, values, times) in new.items():
        keys = steps >> packing.CHUNK_BITS
        for part in np.split(np.arange(len(steps)), np.flatnonzero(np.diff(keys)) + 1):
            parts[(name, int(keys[part[0]]))] = (steps[part], values[part], times[part])
    rows = []
    for name, chunk in sorted(wanted):
        merged = stored.get((name, chunk))
        if (name, chunk) in parts:
            merged = packing.merge(merged, parts[(name, chunk)])
        if merged is None:
            continue
        packed = chunk < newest[name]
        rows.append(
            (run_id, name, chunk, len(merged[0]), packed, *packing.encode(chunk, *merged, packed=packed))
        )
    _upsert(
        MetricChunk,
        ("run_id", "name", "chunk"),
        ("count", "packed", "step_data", "value_data", "time_data"),
        rows,
    )

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


def seal(run_id: int) -> int:
    """Pack the run's raw chunks (its sink closes: no more points come); returns how many."""
    rows = MetricChunk.objects.filter(run_id=run_id, packed=False).values_list(
        "pk", *CHUNK_FIELDS, "time_data"
    )
    sealed = 0
    for pk, chunk, _, *data in rows:
        arrays = packing.decode(chunk, False, *(bytes(d) for d in data))
        step_data, value_data, time_data = packing.encode(chunk, *arrays, packed=True)
        sealed += MetricChunk.objects.filter(pk=pk, packed=False).update(
            packed=True, step_data=step_data, value_data=value_data, time_data=time_data
        )
    return sealed


def series(run_id: int, name: str) -> Arrays:
    """(steps, values, wall times in µs) of one metric of one run, sorted by step."""
    rows = MetricChunk.objects.filter(run_id=run_id, name=name).order_by("chunk")
    parts = [_decode(*data) for data in rows.values_list(*CHUNK_FIELDS, "time_data")]
    if not parts:
        return np.empty(0, np.int64), np.empty(0), np.empty(0, np.int64)
    return tuple(np.concatenate(columns) for columns in zip(*parts, strict=True))


def by_run(run_ids: list[int], name: str, with_time: bool = False) -> Points:
    """(steps, values, wall times in s or None) of metric `name` per run, sorted by step, from one
    query over the runs' chunks; a value that is not finite (NaN, ±infinity) is NaN."""
    if not run_ids:
        return {}
    fields = ["run_id", *CHUNK_FIELDS] + (["time_data"] if with_time else [])
    rows = (
        MetricChunk.objects.filter(run_id__in=run_ids, name=name)
        .order_by("run_id", "chunk")
        .values_list(*fields)
    )
    parts: dict[int, list[tuple[np.ndarray, ...]]] = defaultdict(list)
    for run_id, *data in rows:
        parts[run_id].append(_decode(*data))
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
    for metric, *data in rows.values_list("name", *CHUNK_FIELDS, "time_data").iterator():
        if metric != current and parts:
            yield current, tuple(np.concatenate(c) for c in zip(*parts, strict=True))
            parts = []
        current = metric
        parts.append(_decode(*data))
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
        for name, *data in rows.values_list("name", *CHUNK_FIELDS):
            for step, value in zip(*(a.tolist() for a in _decode(*data)), strict=True):
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
