"""A W&B run history exported as CSV (as pandas writes `run.history()`: an empty cell for a step
a metric skipped) and as Parquet (as the history artifact holds it: nulls), read point by point."""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from imports.formats import DEFAULT_MAPPINGS, ImportFormatError, Point, map_points, read

HISTORY = {
    "_step": [0, 1, 2, 3],
    "_timestamp": [1764800000.5, 1764800010.25, 1764800020.0, 1764800030.75],
    "_runtime": [1.0, 11.0, 21.0, 31.0],
    "train/loss": [0.75, None, 0.5, float("nan")],
    "train/reward": [0.25, 0.5, None, 0.75],
    "actor/pg_clipfrac": [None, None, 0.125, math.inf],
}
EXPECTED = [
    Point(step, name, value, HISTORY["_timestamp"][row])
    for name in ("train/loss", "train/reward", "actor/pg_clipfrac")
    for row, (step, value) in enumerate(zip(HISTORY["_step"], HISTORY[name], strict=True))
    if value is not None
]


def same(points, expected):
    assert [(p.step, p.name, p.time) for p in points] == [(p.step, p.name, p.time) for p in expected]
    for got, want in zip(points, expected, strict=True):
        assert got.value == want.value or (math.isnan(got.value) and math.isnan(want.value))


def write_csv(path, history, extra=""):
    names = list(history)
    rows = [",".join(names) + extra]
    for row in range(len(history["_step"])):
        cells = ["" if history[n][row] is None else repr(history[n][row]) for n in names]
        rows.append(",".join(cells) + (',"a text cell"' if extra else ""))
    path.write_text("\n".join(rows) + "\n")
    return path


def test_a_csv_history_is_read_point_by_point_with_empty_cells_as_gaps(tmp_path):
    run = read("wandb", write_csv(tmp_path / "history.csv", HISTORY, extra=",caption"))
    same(run.points, EXPECTED)
    lab = {p.name for p in map_points(run.points, DEFAULT_MAPPINGS["wandb"])}
    assert lab == {"loss", "reward/mean", "clip_frac"}


def test_a_parquet_history_is_read_point_by_point_with_nulls_as_gaps(tmp_path):
    table = pa.table({**HISTORY, "media": ["a", None, "b", None]})
    pq.write_table(table, tmp_path / "history.parquet")
    same(read("wandb", tmp_path / "history.parquet").points, EXPECTED)


@pytest.mark.parametrize(
    ("content", "where", "rule"),
    [
        (b"_step,loss\n0,0.5\n1,0.25,9\n", "line 3", "3 cells under a header of 2"),
        (b"loss,reward\n0.5,1\n", None, "no _step column"),
        (b"_step,loss\n0,0.5\nfirst,0.25\n", "column _step", "every cell must be a number"),
        (b"_step,loss\n0,0.5\n,0.25\n", "row 2", "_step must be a non-negative integer"),
        (b"_step,loss\n0,0.5\x00\x00\x01", "line 2", "binary data"),
    ],
)
def test_a_bad_csv_is_refused_naming_the_place_and_the_rule(tmp_path, content, where, rule):
    path = tmp_path / "history.csv"
    path.write_bytes(content)
    with pytest.raises(ImportFormatError) as error:
        read("wandb", path)
    assert error.value.where == where and rule in error.value.rule


def test_a_truncated_parquet_file_and_one_over_the_cap_are_refused(tmp_path):
    path = tmp_path / "history.parquet"
    pq.write_table(pa.table(HISTORY), path)
    with pytest.raises(ImportFormatError, match="an import reads at most 100 bytes"):
        read("wandb", path, max_bytes=100)
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(ImportFormatError, match="not a readable Parquet file"):
        read("wandb", path)
