"""The chunk packing and the summary as migrations 0018 and 0019 wrote and read them, frozen here
so that a later change to `experiments.packing` cannot change what those migrations do (the
migration loader passes over modules whose name starts with "_"). Besides them only a test imports
it, which checks that what it wrote and what today's code writes read both ways.

A chunk's three columns, each zlib-compressed after a byte shuffle: steps as 16-bit offsets from
the chunk's first step (consecutive ones as b"R" + first and count), values as float64, wall times
as µs differences; a raw chunk holds the same arrays uncompressed, times absolute. A summary as
`MetricSummary` held it then, its tail the last 10 finite values (float64 bytes from 0019 on)."""

import itertools
import math
import struct
import sys
import zlib
from array import array
from datetime import UTC, datetime, timedelta

import numpy as np

CHUNK_BITS = 10
TAIL = 10
ZLIB_LEVEL = 6
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
RANGE = b"R"


def micros(wall: datetime) -> int:
    delta = wall - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def wall_time(us: int) -> datetime:
    return EPOCH + timedelta(microseconds=int(us))


def split(steps: np.ndarray):
    """(chunk, slice of its points) of sorted `steps`."""
    keys = steps >> CHUNK_BITS
    bounds = [0, *(np.flatnonzero(np.diff(keys)) + 1).tolist(), len(steps)]
    for lo, hi in itertools.pairwise(bounds):
        yield int(keys[lo]), slice(lo, hi)


def _pack(column: np.ndarray) -> bytes:
    column = np.ascontiguousarray(column)
    return zlib.compress(column.view(np.uint8).reshape(-1, column.itemsize).T.tobytes(), ZLIB_LEVEL)


def _unpack(data: bytes, dtype: str) -> np.ndarray:
    raw = np.frombuffer(zlib.decompress(data), dtype=np.uint8)
    return raw.reshape(np.dtype(dtype).itemsize, -1).T.copy().view(dtype).ravel()


def pack_steps(chunk: int, steps: np.ndarray) -> bytes:
    offsets = (steps - (chunk << CHUNK_BITS)).astype("<u2")
    if len(offsets) and int(offsets[-1]) - int(offsets[0]) == len(offsets) - 1:
        return RANGE + struct.pack("<HH", int(offsets[0]), len(offsets))
    return _pack(offsets)


def pack_values(values: np.ndarray) -> bytes:
    return _pack(values.astype("<f8"))


def pack_times(us: np.ndarray) -> bytes:
    return _pack(np.diff(us.astype(np.int64), prepend=np.int64(0)).astype("<i8"))


def decode(chunk: int, packed: bool, step_data: bytes, value_data: bytes, time_data: bytes):
    """A chunk's (steps, values, wall times in µs), packed or raw."""
    base = chunk << CHUNK_BITS
    if not packed:
        return (
            np.frombuffer(step_data, dtype="<u2").astype(np.int64) + base,
            np.frombuffer(value_data, dtype="<f8").astype(np.float64),
            np.frombuffer(time_data, dtype="<i8").astype(np.int64),
        )
    if step_data[:1] == RANGE:
        first, count = struct.unpack("<HH", step_data[1:])
        steps = np.arange(first, first + count, dtype=np.int64) + base
    else:
        steps = _unpack(step_data, "<u2").astype(np.int64) + base
    values = _unpack(value_data, "<f8").astype(np.float64)
    return steps, values, np.cumsum(_unpack(time_data, "<i8")).astype(np.int64)


def _finite_or_none(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def summarise(steps: np.ndarray, values: np.ndarray) -> dict:
    """The summary of a whole series sorted by step: over all points their count, last step and
    the value there (None if not finite); over the finite ones their count, first and last (with
    steps), min, max, total and trapezoid area (None when they overflow), and the last `TAIL`."""
    summary = dict.fromkeys(
        ("last_step", "last", "first_step", "first", "last_finite_step", "last_finite", "min", "max"), None
    ) | {"count": 0, "finite": 0, "total": None, "area": None, "tail": []}
    if not len(steps):
        return summary
    finite = np.isfinite(values)
    fs, fv = steps[finite].astype(np.float64), values[finite]
    summary.update(count=len(steps), last_step=int(steps[-1]), last=_finite_or_none(values[-1]))
    summary["finite"] = int(finite.sum())
    if len(fv):
        with np.errstate(over="ignore", invalid="ignore"):
            total, area = fv.sum(), np.trapezoid(fv, fs) if len(fv) > 1 else 0.0
        summary.update(
            first_step=int(steps[finite][0]),
            first=float(fv[0]),
            last_finite_step=int(steps[finite][-1]),
            last_finite=float(fv[-1]),
            min=float(fv.min()),
            max=float(fv.max()),
            total=_finite_or_none(total),
            area=_finite_or_none(area),
            tail=fv[-TAIL:].tolist(),
        )
    return summary


def pack_tail(tail: list[float]) -> bytes:
    packed = array("d", tail)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def unpack_tail(data) -> list[float]:
    tail = array("d", bytes(data))
    if sys.byteorder != "little":
        tail.byteswap()
    return tail.tolist()
