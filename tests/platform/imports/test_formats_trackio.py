"""A Trackio project written by trackio itself (init/log/finish into a temporary TRACKIO_DIR, in
a subprocess so its module-level directory is the test's, offline), read back point by point."""

from __future__ import annotations

import json
import math
import os
import sqlite3
import subprocess
import sys
import time

import pytest

from imports.formats import DEFAULT_MAPPINGS, ImportFormatError, Point, map_points, read

LOG = """
import json, sys, trackio
for name, rows in json.loads(sys.argv[1]).items():
    trackio.init(project="proj", name=name, config={"lr": 1e-6, "algorithm": "grpo"})
    for step, values in rows:
        trackio.log({k: float(v) for k, v in values.items()}, step=step)
    trackio.finish()
"""
RUNS = {
    "run-a": [
        [0, {"train/loss": 0.75, "train/reward": 0.25}],
        [1, {"train/loss": "nan", "train/reward": 0.5, "x": "inf"}],
        [3, {"train/loss": 0.5}],
    ],
    "run-b": [[0, {"train/loss": 1.0}]],
}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    folder = tmp_path_factory.mktemp("trackio")
    env = {**os.environ, "TRACKIO_DIR": str(folder), "HF_HOME": str(folder / "hf"), "HF_HUB_OFFLINE": "1"}
    env["OMP_NUM_THREADS"] = "1"
    before = time.time()
    subprocess.run(
        [sys.executable, "-c", LOG, json.dumps(RUNS)], env=env, check=True, capture_output=True, timeout=120
    )
    return folder / "proj.db", before, time.time()


@pytest.mark.subprocess
def test_a_run_of_a_trackio_project_is_read_point_by_point(project):
    path, before, after = project
    run = read("trackio", path, run="run-a")
    expected = [
        (step, name, float(value)) for step, values in RUNS["run-a"] for name, value in values.items()
    ]
    got = [(p.step, p.name, p.value) for p in run.points]
    assert len(got) == len(expected)
    for (step, name, value), (gstep, gname, gvalue) in zip(expected, got, strict=True):
        assert (step, name) == (gstep, gname)
        assert gvalue == value or (math.isnan(value) and math.isnan(gvalue))
    assert all(before <= p.time <= after for p in run.points)
    assert run.config["lr"] == 1e-6 and run.config["algorithm"] == "grpo"
    assert run.original_run_id and run.original_run_id != "run-a"
    lab = {p.name for p in map_points(run.points, DEFAULT_MAPPINGS["trackio"])}
    assert lab == {"loss", "reward/mean", "imported/x"}
    assert [p.value for p in read("trackio", path, run="run-b").points] == [1.0]


@pytest.mark.subprocess
def test_a_project_of_several_runs_needs_a_run_named(project):
    path, _, _ = project
    with pytest.raises(ImportFormatError, match=r"holds 2 runs \(run-a, run-b\); name the one to import"):
        read("trackio", path)
    with pytest.raises(ImportFormatError, match="holds no run named 'run-c'"):
        read("trackio", path, run="run-c")
    with pytest.raises(ImportFormatError, match="an import reads at most 1000 bytes"):
        read("trackio", path, max_bytes=1000, run="run-a")


def test_a_file_that_is_not_a_database_is_refused(tmp_path):
    path = tmp_path / "proj.db"
    path.write_text("step,loss\n0,0.5\n")
    with pytest.raises(ImportFormatError, match="not a readable Trackio database"):
        read("trackio", path)


@pytest.mark.subprocess
def test_a_truncated_database_is_refused(project, tmp_path):
    path = tmp_path / "proj.db"
    path.write_bytes(project[0].read_bytes()[:5000])
    with pytest.raises(ImportFormatError, match="not a readable Trackio database"):
        read("trackio", path, run="run-a")


def test_a_bad_row_is_refused_naming_it(tmp_path):
    path = tmp_path / "proj.db"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE metrics (id INTEGER PRIMARY KEY, run_id TEXT, timestamp TEXT, run_name TEXT, step INTEGER, metrics TEXT)"
        )
        db.execute(
            "INSERT INTO metrics VALUES (1, 'r', '2026-12-04T09:39:33+00:00', 'a', 0, '{\"loss\": 0.5}')"
        )
        db.execute("INSERT INTO metrics VALUES (2, 'r', 'yesterday', 'a', 1, '{\"loss\": 0.25}')")
    with pytest.raises(ImportFormatError) as error:
        read("trackio", path)
    assert error.value.where == "metrics row 2" and "timestamp must be ISO 8601" in error.value.rule


def test_a_project_of_trackio_before_run_ids_reads_with_times_without_offset_as_utc(tmp_path):
    path = tmp_path / "proj.db"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE metrics (id INTEGER PRIMARY KEY, timestamp TEXT, run_name TEXT, step INTEGER, metrics TEXT)"
        )
        db.execute(
            "INSERT INTO metrics VALUES (1, '2026-12-04T09:39:33.500000', 'a', 2, '{\"loss\": \"-Infinity\"}')"
        )
    run = read("trackio", path)
    assert run.points == [Point(2, "loss", -math.inf, 1796377173.5)] and run.original_run_id == "a"


def test_a_run_name_is_refused_for_a_tool_of_one_run_per_file(tmp_path):
    with pytest.raises(ImportFormatError, match="a verl file holds one run"):
        read("verl", tmp_path / "x.jsonl", run="a")
