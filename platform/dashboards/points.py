"""A metric's points of many runs, read in one query: on PostgreSQL as one binary array per run
(the fast path), elsewhere as rows; and float arrays as short JSON lists."""

from __future__ import annotations

import math
import time

import numpy as np
import psycopg
from django.db import connection

from experiments.models import MetricPoint

POINT_DTYPE = np.dtype([("run", "i8"), ("step", "f8"), ("value", "f8")])


Points = dict[int, tuple[np.ndarray, np.ndarray, np.ndarray | None]]


def points_by_run(run_ids: list[int], name: str, with_time: bool = False) -> Points:
    """(steps, values, wall times in s or None) of metric `name` per run, sorted by step, from one
    query; a missing value (NaN or infinity when logged) is NaN."""
    if not run_ids:
        return {}
    if connection.vendor == "postgresql":
        return _points_by_run_postgresql(run_ids, name, with_time)
    fields = ["run_id", "step", "value"] + (["wall_time"] if with_time else [])
    rows = list(
        MetricPoint.objects.filter(run_id__in=run_ids, name=name)
        .order_by("run_id", "step")
        .values_list(*fields)
    )
    if not rows:
        return {}
    # fromiter with a record dtype is the fastest way from tuples to arrays here; a None value becomes NaN.
    table = np.fromiter((r[:3] for r in rows) if with_time else rows, dtype=POINT_DTYPE, count=len(rows))
    times = np.array([r[3].timestamp() for r in rows]) if with_time else None
    run_column, steps, values = table["run"], table["step"], table["value"]
    starts = np.flatnonzero(np.diff(run_column, prepend=-1))
    ends = np.append(starts[1:], len(table))
    return {
        int(run_column[a]): (steps[a:b], values[a:b], None if times is None else times[a:b])
        for a, b in zip(starts, ends, strict=True)
    }


def _points_by_run_postgresql(run_ids: list[int], name: str, with_time: bool) -> Points:
    """`points_by_run` on PostgreSQL: one row per run, each column one array in binary form.

    Hundreds of thousands of (run, step, value) rows cost far more to turn into Python tuples than
    to read: here the server aggregates each run's points into arrays (read from the covering
    unique index alone), `array_send` gives their binary form, and numpy reads that directly.
    `array_agg` without ORDER BY avoids a sort per run on the server; the arrays of one row are
    built from the same rows in the same order, so they are sorted by step here instead.
    """
    columns = ["array_send(array_agg(step))", "array_send(array_agg(coalesce(value, 'NaN')))"]
    if with_time:
        columns.append("array_send(array_agg(extract(epoch from wall_time)::float8))")
    sql = (
        f"SELECT run_id, {', '.join(columns)} FROM {connection.ops.quote_name(MetricPoint._meta.db_table)} "
        "WHERE name = %s AND run_id = ANY(%s) GROUP BY run_id"
    )
    connection.ensure_connection()
    started = time.monotonic()
    # A plain psycopg cursor (Django's binds parameters on the client, which rules out binary results).
    with psycopg.Cursor(connection.connection) as cursor:
        rows = cursor.execute(sql, [name, run_ids], binary=True).fetchall()
    if connection.queries_logged:  # shown to Django's query log like any other query
        connection.queries_log.append(
            {"sql": sql % (repr(name), run_ids), "time": f"{time.monotonic() - started:.3f}"}
        )
    points: Points = {}
    for run_id, steps_bytes, values_bytes, *times_bytes in rows:
        steps = _binary_array(steps_bytes, ">i4").astype(float)
        order = np.argsort(steps, kind="stable")
        values = _binary_array(values_bytes, ">f8")[order]
        times = _binary_array(times_bytes[0], ">f8")[order] if with_time else None
        points[run_id] = (steps[order], values, times)
    return points


def _binary_array(data: bytes, element: str) -> np.ndarray:
    """A one-dimensional PostgreSQL array without NULLs, from its binary form (`array_send`):
    a header (dimensions, has-nulls flag, element type, then length and lower bound per dimension),
    then each element as its byte length and its big-endian bytes."""
    dims, has_nulls, _, length, _ = np.frombuffer(data, dtype=">i4", count=5)
    if dims != 1 or has_nulls:
        raise ValueError(f"expected a 1-d array without NULLs (dimensions {dims}, has NULLs {has_nulls})")
    pairs = np.frombuffer(data, dtype=[("size", ">i4"), ("value", element)], offset=20, count=length)
    return pairs["value"].astype(element[1:])


def json_numbers(values: np.ndarray) -> list[float | int | None]:
    """A float array as a short JSON list: ints when whole, else 6 significant digits of its largest
    magnitude; NaN as null."""
    finite = np.isfinite(values)
    if not finite.any():
        return [None] * len(values)
    if finite.all() and np.all(values == np.round(values)) and np.abs(values).max() < 2**53:
        return values.astype(np.int64).tolist()
    scale = np.abs(values[finite]).max()
    decimals = 0 if scale == 0 else int(np.clip(5 - math.floor(math.log10(scale)), -10, 15))
    out = np.round(values, decimals).tolist()
    return out if finite.all() else [v if f else None for v, f in zip(out, finite.tolist(), strict=True)]
