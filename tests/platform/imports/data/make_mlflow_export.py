"""Writes mlflow_export/run.json with MLflow itself and mlflow-export-import's `RunExporter.export_run` (its release on PyPI, 1.2.0): the run
logs mlflow_logged.json's params and metrics (value, timestamp in ms, step) into a throwaway SQLite
tracking store, and export_run writes its folder. Run with the separate MLflow environment:
`.venv-mlflow/bin/python tests/platform/imports/data/make_mlflow_export.py [OUT_DIR]`."""

import json
import os
import sys
import tempfile
from pathlib import Path

store = tempfile.mkdtemp()
# mlflow-export-import makes a client when imported: point it at the throwaway store first.
os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{store}/mlflow.db"

from mlflow.entities import Metric, Param  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from mlflow_export_import.run.export_run import RunExporter  # noqa: E402

here = Path(__file__).parent
out = Path(sys.argv[1]) if len(sys.argv) > 1 else here / "mlflow_export"
logged = json.loads((here / "mlflow_logged.json").read_text())
client = MlflowClient()
experiment = client.create_experiment("imports", artifact_location=f"{store}/artifacts")
run = client.create_run(experiment)
client.log_batch(
    run.info.run_id,
    metrics=[
        Metric(name, float(value), timestamp, step) for name, value, timestamp, step in logged["metrics"]
    ],
    params=[Param(name, value) for name, value in logged["params"].items()],
)
client.set_terminated(run.info.run_id)
RunExporter(client).export_run(run.info.run_id, str(out))
print(out / "run.json")
