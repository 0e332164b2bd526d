"""How a chunk of a metric's series is packed, and the summary of a series: pure functions of
numpy arrays, no database (the metric storage, `experiments.series`, and its migration use them).

A chunk holds the points of one (run, metric) whose steps share `step >> CHUNK_BITS`. Packed, each
of its three columns is zlib-compressed after a byte shuffle (the i-th bytes of all elements together,
as Blosc and HDF5's shuffle filter do: neighbouring values share their high bytes):
- steps: offsets from the chunk's first possible step, as 16-bit integers (consecutive ones as
  their first and count only);
- values: float64 as logged, NaN and ±infinity kept;
- wall times: microseconds since the Unix epoch, as differences from the previous point.
A series' newest chunk is kept raw while its points arrive (`encode`). Bytes that are not what
`encode` wrote (damaged at rest) raise `Damaged` when decoded, never come back as points.
"""

from __future__ import annotations

import itertools
import math
import struct
import sys
import zlib
from array import array
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import numpy as np

CHUNK_BITS = 10
CHUNK_STEPS = 1 << CHUNK_BITS  # steps a chunk spans: ≤ 1,024 points per (run, metric, chunk)
TAIL = 10  # a summary keeps the last TAIL finite values: the mean of the last k ≤ TAIL
ZLIB_LEVEL = 6
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
STEP_MIN, STEP_MAX = -(2**62), 2**62  # steps beyond are refused (a chunk's base must fit 64 bits)


def chunk_of(step: int) -> int:
    return step >> CHUNK_BITS


def split(steps: np.ndarray) -> Iterator[tuple[int, slice]]:
    """Each chunk of `steps` (sorted) with the slice of its points: (chunk, positions)."""
    keys = steps >> CHUNK_BITS
    bounds = [0, *(np.flatnonzero(np.diff(keys)) + 1).tolist(), len(steps)]
    for lo, hi in itertools.pairwise(bounds):
        yield int(keys[lo]), slice(lo, hi)


def check_step(step: int) -> int:
    if not STEP_MIN <= step < STEP_MAX:
        raise ValueError(f"a metric's step must be in [-2**62, 2**62), not {step}")
    return step


def _shuffle(array: np.ndarray) -> bytes:
    return array.view(np.uint8).reshape(-1, array.itemsize).T.tobytes()


def _unshuffle(data: bytes, dtype: str) -> np.ndarray:
    size = np.dtype(dtype).itemsize
    raw = np.frombuffer(zlib.decompress(data), dtype=np.uint8)
    return raw.reshape(size, -1).T.copy().view(dtype).ravel()


def _pack(array: np.ndarray) -> bytes:
    return zlib.compress(_shuffle(np.ascontiguousarray(array)), ZLIB_LEVEL)


RANGE = b"R"  # steps packed as (first offset, count) when consecutive; never a zlib stream's first byte


def pack_steps(chunk: int, steps: np.ndarray) -> bytes:
    offsets = (steps - (chunk << CHUNK_BITS)).astype("<u2")
    if len(offsets) and int(offsets[-1]) - int(offsets[0]) == len(offsets) - 1:  # sorted, unique: consecutive
        return RANGE + struct.pack("<HH", int(offsets[0]), len(offsets))
    return _pack(offsets)


def unpack_steps(chunk: int, data: bytes) -> np.ndarray:
    if data[:1] == RANGE:
        first, count = struct.unpack("<HH", data[1:])
        return np.arange(first, first + count, dtype=np.int64) + (chunk << CHUNK_BITS)
    return _unshuffle(data, "<u2").astype(np.int64) + (chunk << CHUNK_BITS)


def pack_values(values: np.ndarray) -> bytes:
    return _pack(values.astype("<f8"))


def unpack_values(data: bytes) -> np.ndarray:
    return _unshuffle(data, "<f8").astype(np.float64)


def pack_times(micros: np.ndarray) -> bytes:
    return _pack(np.diff(micros.astype(np.int64), prepend=np.int64(0)).astype("<i8"))


def unpack_times(data: bytes) -> np.ndarray:
    return np.cumsum(_unshuffle(data, "<i8")).astype(np.int64)


def encode(
    chunk: int, steps: np.ndarray, values: np.ndarray, times: np.ndarray, packed: bool
) -> tuple[bytes, ...]:
    """A chunk's (step, value, time) columns: packed, or raw (the same arrays uncompressed, times
    absolute) for a series' newest chunk while points still arrive, which costs no compression on
    every flush (`experiments.series` packs it once the series moves on, or the run's sink closes)."""
    if packed:
        return pack_steps(chunk, steps), pack_values(values), pack_times(times)
    offsets = (steps - (chunk << CHUNK_BITS)).astype("<u2")
    return offsets.tobytes(), values.astype("<f8").tobytes(), times.astype("<i8").tobytes()


class Damaged(ValueError):
    """A stored chunk whose bytes are not what `encode` wrote (changed at rest): its points are unknown."""


DECODE_ERRORS = (zlib.error, struct.error, ValueError)  # what damaged bytes raise on the way to arrays


def decode(
    chunk: int, packed: bool, step_data, value_data, time_data=None, count: int | None = None
) -> tuple[np.ndarray, ...]:
    """`encode`'s arrays back (without the times when `time_data` is None). Raises `Damaged` for
    bytes `encode` cannot have written: a column that does not inflate or is not whole elements,
    columns of different lengths (or other than `count`, the points its row says it holds, when
    given), steps out of order or outside the chunk."""
    base = chunk << CHUNK_BITS
    if packed:
        readers = [
            ("steps", lambda: unpack_steps(chunk, step_data)),
            ("values", lambda: unpack_values(value_data)),
            ("wall times", lambda: unpack_times(time_data)),
        ]
    else:
        readers = [
            ("steps", lambda: np.frombuffer(step_data, dtype="<u2").astype(np.int64) + base),
            ("values", lambda: np.frombuffer(value_data, dtype="<f8").astype(np.float64)),
            ("wall times", lambda: np.frombuffer(time_data, dtype="<i8").astype(np.int64)),
        ]
    columns = []
    for what, read in readers[: 2 if time_data is None else 3]:
        try:
            columns.append(read())
        except DECODE_ERRORS as exc:
            raise Damaged(f"its {what} do not decode: {exc}") from exc
    lengths = [len(c) for c in columns]
    if len(set(lengths)) > 1 or (count is not None and lengths[0] != count):
        counts = ", ".join(f"{n} {what}" for n, (what, _) in zip(lengths, readers, strict=False))
        held = "" if count is None else f" for {count} points"
        raise Damaged(f"its columns do not fit{held} ({counts})")
    steps = columns[0]
    if len(steps) and (steps[0] < base or steps[-1] >= base + CHUNK_STEPS or np.any(np.diff(steps) <= 0)):
        raise Damaged(f"its steps are not increasing within {base}–{base + CHUNK_STEPS - 1}")
    return tuple(columns)


def micros(wall: datetime) -> int:
    """A wall time as whole microseconds since the Unix epoch (exact, unlike `timestamp()`)."""
    delta = wall - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def wall_time(us: int) -> datetime:
    return EPOCH + timedelta(microseconds=int(us))


def merge(old: tuple[np.ndarray, ...] | None, new: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """Points (steps, values, times) of `old` and `new` sorted by step, a step in both taking
    `new`'s value and time (a re-executed step replaces the point: never two of one step)."""
    if old is None or len(old[0]) == 0:
        arrays = new
    else:
        arrays = tuple(np.concatenate([n, o]) for n, o in zip(new, old, strict=True))
    # np.unique keeps the first of equal steps: new ones come first.
    _, first = np.unique(arrays[0], return_index=True)
    return tuple(a[first] for a in arrays)


def sorted_points(steps, values, times) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Arrays of one metric's points sorted by step, the last of equal steps kept."""
    steps = np.asarray(steps, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    times = np.asarray(times, dtype=np.int64)
    reverse = slice(None, None, -1)
    return merge(None, (steps[reverse], values[reverse], times[reverse]))


SUMMARY_FIELDS = (
    "count",
    "last_step",
    "last",
    "finite",
    "first_step",
    "first",
    "last_finite_step",
    "last_finite",
    "min",
    "max",
    "total",
    "area",
    "tail",
)


def finite_or_none(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def empty_summary() -> dict:
    """The summary of a series with no points yet (`SUMMARY_FIELDS`), which `extend` extends."""
    return {
        "count": 0,
        "last_step": None,
        "last": None,
        "finite": 0,
        "first_step": None,
        "first": None,
        "last_finite_step": None,
        "last_finite": None,
        "min": None,
        "max": None,
        "total": None,
        "area": None,
        "tail": [],
    }


def summarise(steps, values) -> dict:
    """The summary of a whole series sorted by step (`SUMMARY_FIELDS`): the summary of no points
    extended by all of them, so a summary extended flush by flush is this one to the bit."""
    return extend(empty_summary(), steps, values)


MANY = 64  # points from which `extend` adds them up with numpy rather than one by one


def extend(summary: dict, steps, values) -> dict:
    """`summary` of a series with points (sorted, every step after its `last_step`) appended: the
    point count and last step, the value at that step (None if not finite); over the finite values
    only: their count, first and last (with steps), min, max, total, area (trapezoids over step)
    and the last `TAIL`. Changes `summary` in place and returns it. The sums add each point's
    value and trapezoid in step order, so a summary is the same to the bit however its points
    came (flush by flush, or a whole series at once); a total or area that once overflowed stays
    None. A few points (a flush adds a few to many series) go one by one in plain Python, cheaper
    than numpy; `MANY` or more through numpy (`np.cumsum` adds in order, as the loop does)."""
    if not len(steps):
        return summary
    finite = summary["finite"]
    first_step, first = summary["first_step"], summary["first"]
    last_finite_step, last_finite = summary["last_finite_step"], summary["last_finite"]
    low, high, total, area = summary["min"], summary["max"], summary["total"], summary["area"]
    # An overflowed sum is carried as NaN: a sum that is not finite stays so (∞ + x is ∞ or NaN).
    total, area = math.nan if total is None else total, math.nan if area is None else area
    tail = list(summary["tail"])
    if len(steps) < MANY:
        if isinstance(steps, np.ndarray):
            steps, values = steps.tolist(), values.tolist()
        isfinite = math.isfinite
        for step, value in zip(steps, values, strict=True):
            if not isfinite(value):
                continue
            if finite:
                area += (step - last_finite_step) * (value + last_finite) / 2
                total += value
                if value < low:
                    low = value
                elif value > high:
                    high = value
            else:
                first_step, first, low, high, total, area = step, value, value, value, value, 0.0
            finite += 1
            last_finite_step, last_finite = step, value
            tail.append(value)
        last_step, last = steps[-1], values[-1]
    else:
        steps, values = np.asarray(steps, dtype=np.int64), np.asarray(values, dtype=np.float64)
        keep = np.isfinite(values)
        fs, fv = steps[keep], values[keep]
        if len(fv):
            if finite:  # the trapezoid from the last finite point to the first new one comes first
                ps, pv = np.concatenate(([last_finite_step], fs)), np.concatenate(([last_finite], fv))
                added = fv
            else:
                ps, pv, added = fs, fv, fv[1:]
                first_step, first = int(fs[0]), float(fv[0])
                low, high, total, area = first, first, first, 0.0
            # argmin and argmax find the first of equal values (0.0 and -0.0 alike), as the loop keeps.
            least, most = float(fv[fv.argmin()]), float(fv[fv.argmax()])
            low, high = least if least < low else low, most if most > high else high
            with np.errstate(over="ignore", invalid="ignore"):
                halves = np.diff(ps) * (pv[1:] + pv[:-1]) / 2
                total = float(np.cumsum(np.concatenate(([total], added)))[-1])
                area = float(np.cumsum(np.concatenate(([area], halves)))[-1])
            finite += len(fv)
            last_finite_step, last_finite = int(fs[-1]), float(fv[-1])
            tail += fv[-TAIL:].tolist()
        last_step, last = int(steps[-1]), float(values[-1])
    summary.update(
        count=summary["count"] + len(steps),
        finite=finite,
        last_step=last_step,
        last=last if math.isfinite(last) else None,
        first_step=first_step,
        first=first,
        last_finite_step=last_finite_step,
        last_finite=last_finite,
        min=low,
        max=high,
        total=total if math.isfinite(total) else None,
        area=area if math.isfinite(area) else None,
        tail=tail[-TAIL:],
    )
    return summary


def auc(summary: dict) -> float | None:
    """The area under the finite points over their step span (the first value if one step):
    `dashboards.comparison.curves.final_value`'s "auc" over steps."""
    if not summary["finite"] or summary["area"] is None:
        return None
    span = summary["last_finite_step"] - summary["first_step"]
    return summary["first"] if span == 0 else summary["area"] / span


def pack_tail(tail: list[float]) -> bytes:
    """A summary's tail as stored: float64, little-endian (a flush writes one per metric: this is
    far cheaper than floats written out in JSON)."""
    packed = array("d", tail)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def unpack_tail(data: bytes | memoryview) -> list[float]:
    tail = array("d", bytes(data))
    if sys.byteorder != "little":
        tail.byteswap()
    return tail.tolist()


def mean_last(summary: dict, k: int = TAIL) -> float | None:
    if not 1 <= k <= TAIL:
        raise ValueError(f"k must be in 1..{TAIL} for a summary's mean of the last k (got {k})")
    tail = summary["tail"][-k:]
    return float(np.mean(tail)) if tail else None
