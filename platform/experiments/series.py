"""Runs' metric series in the database: chunks of packed points (`MetricChunk`, packed as
`experiments.packing` says) and one summary per (run, metric) (`MetricSummary`), both written by
`Writer.write` in the caller's transaction (the worker's sink, under the run's heartbeat lock), read by
the pages, the API and the comparison through the functions here. A step logged again replaces its
point, so a re-executed step never doubles one.

Values are kept as logged, NaN and ±infinity included; what readers show of a value that is not
finite is a gap (NaN in arrays, null in JSON, empty in CSV)."""

from __future__ import annotations

import functools
import math
import operator
import sys
from array import array
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

import numpy as np
from django.db import connection, transaction
from django.db.models import F, FloatField, Max, OuterRef, Q, Subquery
from django.db.models.functions import Cast, NullIf

from experiments import packing
from experiments.models import MetricChunk, MetricSummary, Run

# (steps, values, wall times in µs since the epoch) of one metric, sorted by step.
Arrays = tuple[np.ndarray, np.ndarray, np.ndarray]
# (steps, values, wall times in µs) of one metric as a flush brings them, in the order logged.
Columns = tuple[list[int], list[float], list[int]]
# Per run: (steps as floats, values with NaN for what is not finite, wall times in s or None).
Points = dict[int, tuple[np.ndarray, np.ndarray, np.ndarray | None]]


UPSERT_ROWS = 500  # rows per PostgreSQL statement


def _upsert(model, key: tuple[str, ...], columns: tuple[str, ...], rows: list[tuple]) -> None:
    """INSERT … ON CONFLICT (key) DO UPDATE of `rows`, without a model instance per row: on
    PostgreSQL one statement of up to `UPSERT_ROWS` rows (one round trip); on SQLite one
    single-row statement run for every row by sqlite3's own `executemany` (in C; Django's cursor
    would cost more per flush than the statements do), its errors raised as Django's."""
    if not rows:
        return
    table = model._meta.db_table
    if connection.vendor == "sqlite":
        sql = _upsert_sql(connection.vendor, table, key, columns, 1).replace("%s", "?")
        connection.ensure_connection()
        with connection.wrap_database_errors:
            connection.connection.executemany(sql, rows)
        return
    with connection.cursor() as cursor:
        for start in range(0, len(rows), UPSERT_ROWS):
            batch = rows[start : start + UPSERT_ROWS]
            sql = _upsert_sql(connection.vendor, table, key, columns, len(batch))
            cursor.execute(sql, [value for row in batch for value in row])


@functools.lru_cache(maxsize=256)
def _upsert_sql(vendor: str, table: str, key: tuple[str, ...], columns: tuple[str, ...], n: int) -> str:
    quote = connection.ops.quote_name
    names = (*key, *columns)
    row = f"({', '.join(['%s'] * len(names))})"
    return (
        f"INSERT INTO {quote(table)} ({', '.join(map(quote, names))}) VALUES {', '.join([row] * n)} "
        f"ON CONFLICT ({', '.join(map(quote, key))}) "
        f"DO UPDATE SET {', '.join(f'{quote(c)} = excluded.{quote(c)}' for c in columns)}"
    )


CHUNK_FIELDS = ("chunk", "packed", "step_data", "value_data")  # then "time_data" where times are read
CHUNK_KEY = ("run_id", "name", "chunk", "part")
CHUNK_COLUMNS = ("count", "packed", "step_data", "value_data", "time_data")  # written besides the key


def _decode(chunk: int, packed: bool, step_data, value_data, time_data=None) -> tuple[np.ndarray, ...]:
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


def _by_name(points: Iterable[tuple[str, int, float | None, datetime]]) -> dict[str, Arrays]:
    columns: dict[str, tuple[list, list, list]] = defaultdict(lambda: ([], [], []))
    for name, step, value, wall in points:
        steps, values, times = columns[name]
        steps.append(packing.check_step(int(step)))
        values.append(float("nan") if value is None else float(value))
        times.append(packing.micros(wall))
    return {name: packing.sorted_points(*arrays) for name, arrays in columns.items()}


# {(name, chunk): the last part read of it}: what a compaction may delete (`_compact`).
LastParts = dict[tuple[str, int], int]


def _stored(
    run_id: int, wanted: set[tuple[str, int]]
) -> tuple[dict[tuple[str, int], tuple[np.ndarray, ...]], LastParts]:
    """The points of each (name, chunk) in `wanted` as stored (its parts merged in order), and
    the last part read of each."""
    names = sorted({name for name, _ in wanted})
    rows = (
        MetricChunk.objects.filter(run_id=run_id, name__in=names, chunk__in=sorted({c for _, c in wanted}))
        .order_by("name", "chunk", "part")
        .values_list("name", "part", *CHUNK_FIELDS, "time_data")
    )
    stored: dict[tuple[str, int], tuple[np.ndarray, ...]] = {}
    last_parts: LastParts = {}
    for name, part, chunk, *data in rows:
        if (name, chunk) in wanted:
            stored[(name, chunk)] = packing.merge(stored.get((name, chunk)), _decode(chunk, *data))
            last_parts[(name, chunk)] = part
    return stored, last_parts


def _compact(run_id: int, rows: list[tuple], last_parts: LastParts) -> None:
    """Write each row as its chunk's part 0 and delete the chunk's parts 1 to the last one read
    (`last_parts`), never a part written since: those points are not in the row."""
    _upsert(MetricChunk, CHUNK_KEY, CHUNK_COLUMNS, rows)
    doomed = Q()
    for _, name, chunk, *_ in rows:
        if last_parts.get((name, chunk), 0) > 0:
            doomed |= Q(name=name, chunk=chunk, part__gt=0, part__lte=last_parts[(name, chunk)])
    if doomed:
        MetricChunk.objects.filter(doomed, run_id=run_id).delete()


def _merge(run_id: int, points: Iterable[tuple[str, int, float | None, datetime]]) -> None:
    """`Writer.write`'s way for points that do not simply come after what is stored (a step
    logged again or out of order): each point merged into its chunk (a step already there takes
    the new value and time), and each metric's summary brought up to date (extended when every new
    step comes after its last one, else summed up again). A series' newest chunk stays raw while
    it grows and is packed once the series moves past it (or `seal`). Chunks are read, merged and
    written back in the caller's transaction."""
    new = _by_name(points)
    if not new:
        return
    summaries = stored_summaries(run_id, new)
    newest, wanted = {}, set()
    for name, (steps, _, _) in new.items():
        before = summaries.get(name)
        newest[name] = packing.chunk_of(
            max(int(steps[-1]), before["last_step"] if before else int(steps[-1]))
        )
        wanted |= {(name, int(c)) for c in np.unique(steps >> packing.CHUNK_BITS)}
        if before is not None and packing.chunk_of(before["last_step"]) < newest[name]:
            wanted.add((name, packing.chunk_of(before["last_step"])))  # the raw chunk it moves past
    stored, last_parts = _stored(run_id, wanted)
    parts: dict[tuple[str, int], tuple[np.ndarray, ...]] = {}
    for name, (steps, values, times) in new.items():
        for chunk, part in packing.split(steps):
            parts[(name, chunk)] = (steps[part], values[part], times[part])
    rows = []
    for name, chunk in sorted(wanted):
        merged = stored.get((name, chunk))
        if (name, chunk) in parts:
            merged = packing.merge(merged, parts[(name, chunk)])
        if merged is None:
            continue
        packed = chunk < newest[name]
        rows.append(
            (run_id, name, chunk, 0, len(merged[0]), packed, *packing.encode(chunk, *merged, packed=packed))
        )
    _compact(run_id, rows, last_parts)

    updated = {}
    for name, (steps, values, _) in new.items():
        before = summaries.get(name)
        if before is not None and steps[0] > before["last_step"]:
            summary = packing.extend(before, steps, values)  # `before` is this call's own
        else:  # a step logged again, or one before the last: sum the whole series up again
            whole = series(run_id, name)
            summary = packing.summarise(whole[0], whole[1])
        updated[name] = summary
    _upsert_summaries(run_id, updated)


SUMMARY_VALUES = operator.itemgetter(*(f for f in packing.SUMMARY_FIELDS if f != "tail"))
SUMMARY_COLUMNS = (*(f for f in packing.SUMMARY_FIELDS if f != "tail"), "tail")


def _upsert_summaries(run_id: int, summaries: dict[str, dict]) -> None:
    """Store {name: summary} of the run's metrics."""
    rows = [(run_id, name, *SUMMARY_VALUES(s), packing.pack_tail(s["tail"])) for name, s in summaries.items()]
    _upsert(MetricSummary, ("run_id", "name"), SUMMARY_COLUMNS, rows)


def stored_summaries(run_id: int, names) -> dict[str, dict]:
    """{name: summary as `packing.summarise` gives it} of the run's metrics among `names`."""
    rows = MetricSummary.objects.filter(run_id=run_id, name__in=list(names)).values(
        "name", *packing.SUMMARY_FIELDS
    )
    return {row.pop("name"): row | {"tail": packing.unpack_tail(row["tail"])} for row in rows}


@dataclass
class Newest:
    """What a `Writer` knows of one series: its newest chunk's points as stored and its summary."""

    chunk: int | None  # None: the series has no points yet
    steps: array  # offsets from the chunk's first step ("H")
    values: array  # "d"
    times: array  # µs ("q")
    summary: dict
    parts: int  # rows the chunk is stored in: part 0, then one per flush that added to it


RAW_NATIVE = sys.byteorder == "little"  # raw chunks are little-endian, as array's bytes are here


class Writer:
    """The one writer of a run's series: (name, step, value, wall time) points go in through
    `write` and nowhere else. Kept across flushes (the run's sink, under its heartbeat lock), it
    knows each series' newest chunk and summary from its own writes, so a flush of steps after the
    last ones reads nothing, compresses nothing and rewrites nothing: its new points go in as the
    newest chunk's next part (raw), its summary is extended point by point, and a chunk it moves
    past is written whole, packed, as its part 0, its other parts deleted. A series it has not
    written yet starts from what is stored of it (one read per flush that brings new names;
    nothing for a new series), so `Writer(run_id).write(points)` stores points once. A step logged
    again or out of order is merged into its chunk (`_merge`), and what that wrote is read back
    as the new starting point.

    `write` runs in the caller's transaction (under `Run.hold` or the heartbeat: one writer per
    run); a writer kept for the next write is told `committed()` once it commits, or `forget()` if
    it failed (what it knew may not be stored)."""

    def __init__(self, run_id: int):
        self.run_id = run_id
        self.known: dict[str, Newest] = {}
        self._pending: dict[str, Newest] = {}

    def write(self, points: Iterable[tuple[str, int, float | None, datetime]]) -> None:
        grouped: dict[str, list[tuple]] = {}
        walls: dict[datetime, int] = {}  # a flush's points share a few wall times
        for name, step, value, wall in points:
            us = walls.get(wall)
            if us is None:
                us = walls[wall] = packing.micros(wall)
            rows = grouped.get(name)
            if rows is None:
                rows = grouped[name] = []
            rows.append((step, value, us))
        columns_of: dict[str, Columns] = {}
        for name, rows in grouped.items():
            steps, values, times = zip(*rows, strict=True)
            steps = list(map(int, steps))
            packing.check_step(min(steps)), packing.check_step(max(steps))
            values = [math.nan if v is None else float(v) for v in values]
            columns_of[name] = (steps, values, list(times))
        unknown = [name for name in columns_of if name not in self.known]
        if unknown and RAW_NATIVE:
            self.known |= self._start(unknown)
        fast, slow = {}, []
        for name, columns in columns_of.items():
            known = self.known.get(name)
            steps = columns[0]
            last_step = None if known is None else known.summary["last_step"]
            if (
                RAW_NATIVE
                and known is not None
                and (last_step is None or steps[0] > last_step)
                and (len(steps) == 1 or all(map(int.__lt__, steps, steps[1:])))
            ):
                fast[name] = columns
            else:
                slow += [(name, s, v, packing.wall_time(us)) for s, v, us in zip(*columns, strict=True)]
        compacted, segments, summaries, pending, last_parts = [], [], {}, {}, {}
        for name, columns in fast.items():
            newest, passed, added = self._extend(self.known[name], *columns)
            pending[name] = newest
            for last_part, row in passed:
                compacted.append((self.run_id, name, *row))
                last_parts[(name, row[0])] = last_part
            segments.append((self.run_id, name, *added))
            summaries[name] = newest.summary
        _compact(self.run_id, compacted, last_parts)
        _upsert(MetricChunk, CHUNK_KEY, CHUNK_COLUMNS, segments)
        _upsert_summaries(self.run_id, summaries)
        if slow:
            _merge(self.run_id, slow)
            pending |= self._read_newest({name for name, *_ in slow})
        self._pending = pending

    def committed(self) -> None:
        self.known |= self._pending
        self._pending = {}

    def forget(self) -> None:
        self.known, self._pending = {}, {}

    @staticmethod
    def _extend(
        known: Newest, steps: list[int], values: list[float], times: list[int]
    ) -> tuple[Newest, list[tuple], tuple]:
        """The series with points (sorted, after its last step) appended; the rows of the chunks it
        moved past (whole, packed, as their part 0), each with the last part it had stored of it;
        and the row of the newest chunk's next part (the new points in it, raw)."""
        # In place: a write that fails is followed by `forget()`, which drops what it knew.
        packing.extend(known.summary, steps, values)
        if known.chunk is None:  # a new series
            known.chunk = steps[0] >> packing.CHUNK_BITS
        chunk, parts = known.chunk, known.parts
        start = len(known.steps)  # where the new points of the newest chunk begin
        passed, first = [], 0
        for last in range(len(steps) + 1):  # the new points chunk by chunk
            if last < len(steps) and steps[last] >> packing.CHUNK_BITS == chunk:
                continue
            base = chunk << packing.CHUNK_BITS
            known.steps.extend([step - base for step in steps[first:last]])
            known.values.extend(values[first:last])
            known.times.extend(times[first:last])
            if last == len(steps):
                break
            arrays = _arrays(chunk, known.steps, known.values, known.times)
            row = (chunk, 0, len(known.steps), True, *packing.encode(chunk, *arrays, packed=True))
            passed.append((parts - 1, row))
            chunk, parts, start, first = steps[last] >> packing.CHUNK_BITS, 0, 0, last
            known.steps, known.values, known.times = array("H"), array("d"), array("q")
        steps, values, times = known.steps, known.values, known.times
        added = (
            chunk,
            parts,
            len(steps) - start,
            False,
            steps[start:].tobytes(),
            values[start:].tobytes(),
            times[start:].tobytes(),
        )
        known.chunk, known.parts = chunk, parts + 1
        return known, passed, added

    def _start(self, names: list[str]) -> dict[str, Newest]:
        """What is stored of series this writer has not written yet: a run resumed by another
        worker has some; a new series has none and starts empty."""
        newest = self._read_newest(set(names))
        empty = {
            name: Newest(None, array("H"), array("d"), array("q"), packing.empty_summary(), 0)
            for name in names
            if name not in newest
        }
        return newest | empty

    def _read_newest(self, names: set[str]) -> dict[str, Newest]:
        """Each series' newest chunk and summary as stored now (in the writer's transaction)."""
        summaries = stored_summaries(self.run_id, names)
        wanted = {(name, packing.chunk_of(s["last_step"])) for name, s in summaries.items()}
        parts = {
            name: n
            for name, chunk, n in MetricChunk.objects.filter(
                run_id=self.run_id, name__in=names, chunk__in=sorted({c for _, c in wanted})
            )
            .values("name", "chunk")
            .annotate(n=Max("part"))
            .values_list("name", "chunk", "n")
            .order_by()
            if (name, chunk) in wanted
        }
        newest = {}
        for (name, chunk), (steps, values, times) in _stored(self.run_id, wanted)[0].items():
            newest[name] = Newest(
                chunk,
                array("H", (steps - (chunk << packing.CHUNK_BITS)).astype(np.uint16).tobytes()),
                array("d", values.tobytes()),
                array("q", times.tobytes()),
                summaries[name],
                parts[name] + 1,
            )
        return newest


def _arrays(chunk: int, steps: array, values: array, times: array) -> tuple[np.ndarray, ...]:
    offsets = np.frombuffer(steps, dtype=np.uint16).astype(np.int64)
    return (
        offsets + (chunk << packing.CHUNK_BITS),
        np.frombuffer(values),
        np.frombuffer(times, dtype=np.int64),
    )


def seal(run_id: int) -> int:
    """Pack the run's chunks that are raw or in parts (its sink closes: no more points come), each
    into its part 0; returns how many. Under the run's row lock, which its writers hold while they
    write (the sink's heartbeat), so a point written meanwhile is never lost: it waits, or comes
    after and stays a part of its own."""
    with transaction.atomic():
        Run.objects.select_for_update().filter(pk=run_id).values_list("pk", flat=True).first()
        wanted = set(MetricChunk.objects.filter(run_id=run_id, packed=False).values_list("name", "chunk"))
        if not wanted:
            return 0
        stored, last_parts = _stored(run_id, wanted)
        rows = [
            (run_id, name, chunk, 0, len(arrays[0]), True, *packing.encode(chunk, *arrays, packed=True))
            for (name, chunk), arrays in stored.items()
        ]
        _compact(run_id, rows, last_parts)
    return len(rows)


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
