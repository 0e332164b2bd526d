"""A Trackio project: the SQLite database Trackio keeps per project (`$TRACKIO_DIR/<project>.db`,
by default under `$HF_HOME/trackio`), read with sqlite3, read-only. Its `metrics` table holds one
row per `trackio.log` call (`run_name`, `run_id`, `step`, `timestamp` in ISO 8601, `metrics` as
JSON, NaN and ±inf written as the strings "NaN", "Infinity", "-Infinity"); `configs` holds each
run's config. A project holds several runs: name the one to read where it holds more than one.
Media (Trackio's `{"_type": …}` objects) and the system metrics table are not read."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from . import common, trl
from .base import ImportFormatError, ParsedRun, Point

TOOL = "trackio"

# Trackio keeps the names its logger gave: TRL's (`report_to="trackio"`, TRL's recommended tracker,
# its names rewritten as `train/x`, `eval/x`) most often.
MAPPING = trl.rewritten(trl.MAPPING)

_NON_FINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


def read(path: Path, max_bytes: int = common.MAX_BYTES, run: str | None = None) -> ParsedRun:
    if not path.is_file():
        raise ImportFormatError(path, None, "not a file" if path.exists() else "no such file")
    wal = path.with_name(path.name + "-wal")
    common.check_size(path, [path, wal] if wal.exists() else [path], max_bytes)
    try:
        connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return _read(path, connection, run)
        finally:
            connection.close()
    except sqlite3.DatabaseError as error:
        raise ImportFormatError(path, None, f"not a readable Trackio database ({error})") from None


def _read(path: Path, connection: sqlite3.Connection, run: str | None) -> ParsedRun:
    tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "metrics" not in tables:
        raise ImportFormatError(path, None, "no metrics table; expected a Trackio project database")
    runs = [row[0] for row in connection.execute("SELECT DISTINCT run_name FROM metrics ORDER BY run_name")]
    if run is None and len(runs) > 1:
        raise ImportFormatError(
            path, None, f"holds {len(runs)} runs ({', '.join(runs)}); name the one to import"
        )
    run = runs[0] if run is None and runs else run
    if run not in runs:
        raise ImportFormatError(
            path, None, f"holds no run named {run!r} (it holds {', '.join(runs) or 'none'})"
        )
    columns = {row[1] for row in connection.execute("PRAGMA table_info(metrics)")}
    run_id_column = "run_id" if "run_id" in columns else "NULL"  # Trackio before run ids
    rows = connection.execute(
        f"SELECT id, {run_id_column}, step, timestamp, metrics FROM metrics WHERE run_name = ? ORDER BY id",
        (run,),
    ).fetchall()
    points, run_id = [], None
    for row_id, row_run_id, step, stamp, values in rows:
        where = f"metrics row {row_id}"
        run_id = row_run_id or run_id
        time = _time(path, where, stamp)
        logged = common.json_object(path, where, values)
        for name, value in _numbers(logged):
            points.append(Point(common.step(path, where, step), name, value, time))
    config = {}
    if "configs" in tables:
        found = connection.execute("SELECT config FROM configs WHERE run_name = ?", (run,)).fetchone()
        config = common.json_object(path, "configs", found[0]) if found else {}
    return ParsedRun(
        tool=TOOL, original_run_id=run_id or run, config=config, points=common.unique(path, points)
    )


def _time(path: Path, where: str, stamp: str) -> float:
    try:
        moment = datetime.fromisoformat(stamp)
    except (TypeError, ValueError):
        raise ImportFormatError(path, where, f"timestamp must be ISO 8601 (got {stamp!r})") from None
    # Trackio writes UTC with its offset; a time without one is taken as UTC too.
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _numbers(values: dict, prefix: str = ""):
    for key, value in values.items():
        if isinstance(value, str) and value in _NON_FINITE:
            yield f"{prefix}{key}", _NON_FINITE[value]
        elif isinstance(value, dict) and "_type" not in value:
            yield from _numbers(value, f"{prefix}{key}/")
        elif common.is_number(value):
            yield f"{prefix}{key}", float(value)
