"""An MLflow run exported by mlflow-export-import: data/mlflow_export/run.json was written by
MLflow and the package's RunExporter (data/make_mlflow_export.py, in the separate MLflow
environment) from data/mlflow_logged.json's values, which the reader must give back point by
point, times included; and written again now where that environment has the package."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest

from imports.formats import DEFAULT_MAPPINGS, ImportFormatError, map_points, read

DATA = Path(__file__).parent / "data"
MLFLOW_PYTHON = Path(__file__).parents[3] / ".venv-mlflow" / "bin" / "python"


def assert_logged_values(run):
    logged = json.loads((DATA / "mlflow_logged.json").read_text())
    expected = {(step, name): (float(value), stamp / 1000) for name, value, stamp, step in logged["metrics"]}
    got = {(p.step, p.name): (p.value, p.time) for p in run.points}
    assert got.keys() == expected.keys()
    for key, (value, time) in expected.items():
        assert got[key][1] == time, key
        assert got[key][0] == value or (math.isnan(value) and math.isnan(got[key][0])), key
    assert run.config == logged["params"]


def test_the_exported_run_is_read_point_by_point():
    run = read("mlflow", DATA / "mlflow_export")
    assert_logged_values(run)
    assert run.tool == "mlflow" and run.tool_version == "3.17.2"
    assert run.original_run_id == "5c3d242d42f649518c91a512bf5074b1"
    lab = {(p.step, p.name) for p in map_points(run.points, DEFAULT_MAPPINGS["mlflow"])}
    assert {(3, "clip_frac"), (0, "reward/mean"), (0, "imported/perf/throughput")} <= lab


def mlflow_export_import_available() -> bool:
    if not MLFLOW_PYTHON.exists():
        return False
    check = subprocess.run([str(MLFLOW_PYTHON), "-c", "import mlflow_export_import"], capture_output=True)
    return check.returncode == 0


@pytest.mark.subprocess
def test_a_run_exported_now_by_mlflow_export_import_is_read_point_by_point(tmp_path):
    assert mlflow_export_import_available(), f"{MLFLOW_PYTHON} lacks mlflow-export-import: run `make mlflow`"
    subprocess.run(
        [str(MLFLOW_PYTHON), str(DATA / "make_mlflow_export.py"), str(tmp_path / "export")],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert_logged_values(read("mlflow", tmp_path / "export" / "run.json"))


def test_the_layout_before_format_version_2_reads_too(tmp_path):
    exported = json.loads((DATA / "mlflow_export" / "run.json").read_text())
    (tmp_path / "run.json").write_text(json.dumps(exported["mlflow"]))
    assert_logged_values(read("mlflow", tmp_path))


@pytest.mark.parametrize(
    ("content", "where", "rule"),
    [
        (b'{"mlflow": {"metrics": {"loss": [{"value": 0.5, "timestamp": 1, "st', None, "not JSON"),
        (b'{"mlflow": {"info": {}}}', None, 'no "metrics" object'),
        (b'{"mlflow": {"metrics": {"loss": 0.5}}}', "metric 'loss'", "expected a list"),
        (
            b'{"mlflow": {"metrics": {"loss": [{"value": 0.5, "timestamp": 1, "step": 0}, {"value": "x", "step": 1}]}}}',
            "metric 'loss' entry 1",
            "expected {value: number",
        ),
        (
            b'{"mlflow": {"metrics": {"loss": [{"value": 0.5, "timestamp": 1, "step": -1}]}}}',
            "metric 'loss' entry 0",
            "step must be a non-negative integer",
        ),
        (
            b'{"mlflow": {"metrics": {"loss": [{"value": 0.5, "timestamp": "today", "step": 0}]}}}',
            "metric 'loss' entry 0",
            "timestamp must be a Unix time in milliseconds",
        ),
        (b"\x1f\x8b\x08\x00\x00\x00", "line 1", "binary data"),
    ],
)
def test_a_bad_export_is_refused_naming_the_entry_and_the_rule(tmp_path, content, where, rule):
    (tmp_path / "run.json").write_bytes(content)
    with pytest.raises(ImportFormatError) as error:
        read("mlflow", tmp_path)
    assert error.value.where == where and rule in error.value.rule
    assert error.value.path.endswith("run.json")


def test_a_folder_without_run_json_and_an_export_over_the_cap_are_refused(tmp_path):
    with pytest.raises(ImportFormatError, match="run.json: no such file"):
        read("mlflow", tmp_path)
    shutil.copy(DATA / "mlflow_export" / "run.json", tmp_path / "run.json")
    with pytest.raises(ImportFormatError, match="an import reads at most 1000 bytes"):
        read("mlflow", tmp_path, max_bytes=1000)
