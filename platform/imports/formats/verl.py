"""verl's file logger (`verl/utils/tracking.py`, `trainer.logger=[file]`): one line per logging
call, `{"step": N, "data": {metric: value}}`, under `$VERL_FILE_LOGGER_ROOT/<project>/<exp>.jsonl`.
orjson writes a NaN or ±inf as null, so a non-finite value shows here as a gap. The lines keep
no wall-clock time: every point's time is None."""

from __future__ import annotations

from pathlib import Path

from . import common
from .base import ImportFormatError, ParsedRun, Point

TOOL = "verl"

# verl's names (verl/trainer/ppo/metric_utils.py, the actor's and rollout_corr's metrics) → the
# lab's. `actor/ppo_kl` is the mean of old − logp over the batch, the behaviour policy's k1;
# `rollout_corr/kl` and `k3_kl` compare the rollout engine's log-probs with the trainer's.
MAPPING = {
    "actor/pg_clipfrac": "clip_frac",
    "actor/ppo_kl": "kl/behavior",
    "actor/entropy": "entropy",
    "actor/pg_loss": "loss",
    "actor/grad_norm": "grad_norm",
    "actor/lr": "lr",
    "critic/score/mean": "reward/mean",
    "response_length/mean": "response_length/mean",
    "rollout_corr/kl": "mismatch/k1",
    "rollout_corr/k3_kl": "mismatch/k3",
    "timing_s/step": "time/step_s",
}


def read(path: Path, max_bytes: int = common.MAX_BYTES) -> ParsedRun:
    points = []
    for number, line in common.lines(path, max_bytes):
        where = f"line {number}"
        row = common.json_object(path, where, line)
        step = common.step(path, where, row.get("step"))
        data = row.get("data")
        if not isinstance(data, dict):
            raise ImportFormatError(
                path, where, 'expected {"step": N, "data": {metric: value}}; "data" is not an object'
            )
        points.extend(Point(step, name, value, None) for name, value in common.numbers(data))
    return ParsedRun(tool=TOOL, points=common.unique(path, points))
