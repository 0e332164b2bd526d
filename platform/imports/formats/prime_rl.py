"""prime-rl's `metrics.jsonl`, written by its file monitor: one JSON object per line,
`{"step": N, "time": <Unix seconds>, **metrics}`, trainer and orchestrator alike. prime-rl drops
non-finite values before it writes, so a NaN step shows here as a gap; a NaN or ±inf that a line
does hold is kept."""

from __future__ import annotations

from pathlib import Path

from . import common
from .base import ParsedRun, Point

TOOL = "prime-rl"

# prime-rl's names (trainer: src/prime_rl/trainer/rl/train.py; orchestrator: its metrics) → the
# lab's (docs/algorithms.md §7). `mismatch_kl` is r − log r − 1 with r = π_trainer / π_inference,
# the k3 estimate of the rollout mismatch; `off_policy` counts policy versions behind.
MAPPING = {
    "loss/mean": "loss",
    "entropy/mean": "entropy",
    "entropy/all/mean": "entropy",
    "mismatch_kl/mean": "mismatch/k3",
    "mismatch_kl/all/mean": "mismatch/k3",
    "optim/grad_norm": "grad_norm",
    "optim/lr": "lr",
    "reward/mean": "reward/mean",
    "reward/std": "reward/std",
    "decode_len/mean": "response_length/mean",
    "off_policy/mean": "staleness/mean",
    "off_policy/max": "staleness/max",
    "off_policy/in_flight/mean": "staleness/in_flight",
    "off_policy/in_queue/mean": "staleness/in_queue",
    "perf/throughput": "tokens_per_s",
    "time/step": "time/step_s",
    "time/wait_for_batch": "time/wait_s",
}


def read(path: Path, max_bytes: int = common.MAX_BYTES) -> ParsedRun:
    points = []
    for number, line in common.lines(path, max_bytes):
        where = f"line {number}"
        row = common.json_object(path, where, line)
        step = common.step(path, where, row.get("step"))
        time = common.timestamp(path, where, row.get("time"))
        values = {key: value for key, value in row.items() if key not in ("step", "time")}
        points.extend(Point(step, name, value, time) for name, value in common.numbers(values))
    return ParsedRun(tool=TOOL, points=common.unique(path, points))
