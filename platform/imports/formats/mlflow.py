"""An MLflow run as mlflow-export-import's `export-run` writes it: a folder with `run.json` (and
`artifacts/`, not read), or that `run.json` alone. It is plain JSON, read without MLflow:
`{"system": {...}, "mlflow": {"info": {run_id, ...}, "params": {name: text}, "metrics":
{name: [{"value", "timestamp" (ms), "step"}, ...]}, "tags": {...}}}`; exports before its format
version 2 have the "mlflow" object's fields at the top. MLflow keeps NaN and ±inf as logged."""

from __future__ import annotations

from pathlib import Path

from . import common, trl, verl
from .base import ImportFormatError, ParsedRun, Point

TOOL = "mlflow"

# MLflow keeps the names its logger gave, most often verl's (`trainer.logger=[mlflow]`, "@" written
# as "_at_") or the HF Trainer's (`report_to="mlflow"`, its own names).
MAPPING = {**verl.MAPPING, **trl.MAPPING}


def read(path: Path, max_bytes: int = common.MAX_BYTES) -> ParsedRun:
    if path.is_dir():
        path = path / "run.json"
    export = common.json_object(path, None, common.text(path, max_bytes))
    run = export.get("mlflow", export)
    metrics = run.get("metrics") if isinstance(run, dict) else None
    if not isinstance(metrics, dict):
        raise ImportFormatError(path, None, 'expected mlflow-export-import\'s run.json: no "metrics" object')
    points = []
    for name, history in metrics.items():
        if not isinstance(history, list):
            raise ImportFormatError(path, f"metric {name!r}", "expected a list of {value, timestamp, step}")
        for index, entry in enumerate(history):
            where = f"metric {name!r} entry {index}"
            if not isinstance(entry, dict) or not common.is_number(entry.get("value")):
                raise ImportFormatError(path, where, "expected {value: number, timestamp: ms, step: integer}")
            step = common.step(path, where, entry.get("step"))
            millis = common.timestamp(path, where, entry.get("timestamp"), "timestamp", "milliseconds")
            time = None if millis is None else millis / 1000
            points.append(Point(step, name, float(entry["value"]), time))
    info = run.get("info") if isinstance(run.get("info"), dict) else {}
    system = export.get("system") if isinstance(export.get("system"), dict) else {}
    params = run.get("params") if isinstance(run.get("params"), dict) else {}
    return ParsedRun(
        tool=TOOL,
        tool_version=system.get("mlflow_version"),
        original_run_id=info.get("run_id"),
        config=dict(params),
        points=common.unique(path, points),
    )
