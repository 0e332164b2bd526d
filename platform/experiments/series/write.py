"""Writing runs' metric series: `Writer.write` (the one way in: the worker's sink, under the run's
heartbeat lock), the merge of a step logged again, the summaries kept beside the chunks, and
`seal`, which compacts a finished run's parts."""

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
from django.db.models import Max, Q

from experiments import packing
from experiments.models import MetricChunk, MetricSummary, Run
from experiments.series.read import CHUNK_FIELDS, Arrays, Columns, decode, series, stored_summaries

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


CHUNK_KEY = ("run_id", "name", "chunk", "part")
CHUNK_COLUMNS = ("count", "packed", "step_data", "value_data", "time_data")  # written besides the key


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
            stored[(name, chunk)] = packing.merge(stored.get((name, chunk)), decode(chunk, *data))
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
