"""Runs' metric series in the database: chunks of packed points (`MetricChunk`, packed as
`experiments.packing` says) and one summary per (run, metric) (`MetricSummary`), both written by
`Writer.write` in the caller's transaction (the worker's sink, under the run's heartbeat lock), read by
the pages, the API and the comparison through the functions here. A step logged again replaces its
point, so a re-executed step never doubles one. `write` holds the writer, `read` the readers.

Values are kept as logged, NaN and ±infinity included; what readers show of a value that is not
finite is a gap (NaN in arrays, null in JSON, empty in CSV)."""

from experiments.series.read import (
    Arrays,
    Damage,
    Points,
    by_run,
    notes_by_metric,
    points_of,
    recent,
    series,
    shown,
    stored_summaries,
    summary,
)
from experiments.series.write import Writer, seal

__all__ = [
    "Arrays",
    "Damage",
    "Points",
    "Writer",
    "by_run",
    "notes_by_metric",
    "points_of",
    "recent",
    "seal",
    "series",
    "shown",
    "stored_summaries",
    "summary",
]
