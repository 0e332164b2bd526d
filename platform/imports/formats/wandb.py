"""A W&B run's history exported as CSV or Parquet (`run.history(samples=…)` / `scan_history()`
saved by the user, the UI's CSV export, or the `<run-id>-history` Parquet artifact): one row per
logged step, `_step`, `_timestamp` (Unix seconds) and `_runtime` beside a column per metric. An
empty cell is a gap. A column whose cells are not all numbers (text, media) is not a metric and is
left out; so are W&B's own `_` columns. The file's kind is told by its name (`.parquet`, `.csv`)
or, failing that, by Parquet's magic bytes."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from . import common, prime_rl, trl, verl
from .base import ImportFormatError, ParsedRun, Point

TOOL = "wandb"

# W&B keeps the names its logger gave: prime-rl's, verl's (`trainer.logger=[wandb]`) or the HF
# Trainer's (`report_to="wandb"`, rewritten as `train/x`, `eval/x`).
MAPPING = {**prime_rl.MAPPING, **verl.MAPPING, **trl.rewritten(trl.MAPPING)}


def read(path: Path, max_bytes: int = common.MAX_BYTES) -> ParsedRun:
    raw = common.data(path, max_bytes)
    parquet = path.suffix.lower() == ".parquet" or (path.suffix.lower() != ".csv" and raw[:4] == b"PAR1")
    columns = _parquet_columns(path, raw) if parquet else _csv_columns(path, raw)
    if "_step" not in columns:
        raise ImportFormatError(path, None, "no _step column; expected a W&B history export")
    steps, times = columns["_step"], columns.get("_timestamp")
    points = []
    for name, values in columns.items():
        if name.startswith("_") or not name:
            continue
        for row, value in enumerate(values):
            if value is None:
                continue
            where = f"row {row + 1}"
            step = common.step(path, where, steps[row], "_step")
            time = common.timestamp(path, where, times[row], "_timestamp") if times else None
            points.append(Point(step, name, value, time))
    return ParsedRun(tool=TOOL, points=common.unique(path, points))


def _number(cell: str) -> float | None:
    """A CSV cell as a number; None for an empty cell; ValueError for text."""
    cell = cell.strip()
    return None if cell == "" else float(cell)


def _csv_columns(path: Path, raw: bytes) -> dict[str, list]:
    """Each column's cells as numbers (None where empty), the columns holding text left out."""
    rows = list(csv.reader(io.StringIO(common.decode(path, raw))))
    if not rows:
        raise ImportFormatError(path, None, "holds no metric values")
    header, body = rows[0], rows[1:]
    for index, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise ImportFormatError(
                path, f"line {index}", f"{len(row)} cells under a header of {len(header)}"
            )
    columns = {}
    for index, name in enumerate(header):
        try:
            columns[name] = [_number(row[index]) for row in body]
        except ValueError:
            if name in ("_step", "_timestamp"):
                raise ImportFormatError(path, f"column {name}", "every cell must be a number") from None
    return columns


def _parquet_columns(path: Path, raw: bytes) -> dict[str, list]:
    """Each numeric column's values (None where null), the other columns left out."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(pa.BufferReader(raw))
    except (pa.ArrowException, OSError) as error:
        raise ImportFormatError(path, None, f"not a readable Parquet file ({error})") from None
    columns = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        kind = column.type
        if pa.types.is_integer(kind) or pa.types.is_floating(kind):
            columns[name] = [None if value is None else float(value) for value in column.to_pylist()]
        elif name in ("_step", "_timestamp"):
            raise ImportFormatError(path, f"column {name}", f"must be numbers, not {kind}")
    return columns
