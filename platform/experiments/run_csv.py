"""A run's metric points as CSV: what `GET /api/runs/{id}/metrics?format=csv` and the run page's
download send."""

from __future__ import annotations

import csv
import io

from experiments import series
from experiments.models import Run
from experiments.packing import wall_time


def metrics_csv(run: Run, name: str = "") -> str:
    """Every metric point of the run (or of metric `name`) as CSV: name,step,value,wall_time,note,
    in name and step order; a missing value (NaN or infinity when logged) is empty. A damaged
    chunk's points are left out: after its metric's points, a row with only the name and the note
    (`series.Damage.note`)."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["name", "step", "value", "wall_time", "note"])
    damaged: list[series.Damage] = []
    for metric, (steps, values, times) in series.points_of(run.pk, name, damaged):
        for step, value, us in zip(steps.tolist(), values.tolist(), times.tolist(), strict=True):
            shown = series.shown(value)
            writer.writerow(
                [metric, step, "" if shown is None else repr(shown), wall_time(us).isoformat(), ""]
            )
        writer.writerows([metric, "", "", "", d.note()] for d in damaged if d.name == metric)
    return out.getvalue()
